"""`load`: study.yaml -> a validated, frozen `Spec`, every mistake of the file in one line each.

Everything a user can get wrong in a study file is caught in `load`, before anything touches
storage or the output directory. Each mistake is one line naming the file and the key, and
`load` reports every mistake of a file at once. The sections' shapes live in `schema`, what
spans sections in `checks`, the params' own rules (ranges, choices, samplers, pruners) in
`searchspace`, the storage URL's in `storageurl`.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import (
    AliasChoices,
    BaseModel,
    ValidationError,
)

from sweep._core import ConfigError, Problem, short, yamlfile
from sweep.spec import container as containerspec
from sweep.spec import scheduler as scheduler_spec
from sweep.spec.checks import resolve
from sweep.spec.schema import (
    AccelerateSettings,
    GpusSection,
    ReportSection,
    ResultSection,
    Spec,
    StudySection,
    TensorboardSource,
    TrainerSection,
)
from sweep.spec.searchspace import (
    PARAM_TYPES,
    YES_NO,
    BoolParam,
    CategoricalParam,
    FixedParam,
    FloatParam,
    IntParam,
)

STORAGE_ENV = "SWEEP_STORAGE"
def load(
    path: str | Path, runnable: bool = True, *, n_trials: int | None = None,
    gpus: list[int] | None = None, storage: str | None = None,
) -> Spec:
    """Read and validate a study file; raise one `ConfigError` listing every problem found
    (one line each).

    `runnable=False` is for verbs that only read the study (status, summary): the trainer
    script need not exist and the sampler's optional dependencies need not be installed.
    `n_trials`, `gpus` and `storage` override the file (the command line's --n-trials,
    --gpus, --storage); `$SWEEP_STORAGE` overrides the file's storage too, and an error
    about the URL names where it came from.
    """
    path = Path(path)
    file = str(path)
    text = _read_study_file(file, path)
    try:
        data = yamlfile.load(text)
    except yamlfile.YamlError as e:
        raise ConfigError(file, f"line {e.line}" if e.line else "", e.problem) from None
    if not isinstance(data, dict):
        raise ConfigError(file, "", "the study file must be a mapping with study/trainer/params")
    problems: list[Problem] = []
    _refuse_nul(file, data, "", problems)
    for key in NOT_IN_FILES:
        if key in data:
            problems.append(Problem(file, str(key), f"unknown key `{key}`"))
            del data[key]
    if isinstance(data.get("params"), dict):
        for name in data["params"]:
            if not isinstance(name, str):
                problems.append(Problem(
                    file, f"params.{name!r}", "a param name must be text; YAML reads unquoted "
                    "on/off/yes/no/true/false and numbers as such: quote it"))
    from_env = os.environ.get(STORAGE_ENV)
    storage_from = "--storage" if storage else f"${STORAGE_ENV}" if from_env else "study.storage"
    storage = storage or from_env
    if isinstance(data.get("study"), dict):
        if n_trials is not None:
            data["study"]["n_trials"] = n_trials
        if storage:
            data["study"]["storage"] = storage
    if gpus is not None:
        data["gpus"] = {**(data.get("gpus") or {}), "ids": list(gpus)}
    spec = None
    try:
        spec = Spec.model_validate(data)
    except ValidationError as e:
        seen = {p.key for p in problems}
        problems += [p for p in _problems(file, e, data) if p.key not in seen]
    if problems or spec is None:
        raise ConfigError.of(problems)
    return resolve(spec.model_copy(update={"storage_from": storage_from}), path, runnable)


NOT_IN_FILES = ("source", "storage_from")  # fields of `Spec` that `load` sets, not the file


MAX_FILE = yamlfile.MAX_FILE  # a study file is a few kB


def _read_study_file(file: str, path: Path) -> str:
    """The text of a regular, UTF-8 file of at most MAX_FILE bytes (never blocks)."""
    try:
        return yamlfile.read_text(path, "the study file")
    except yamlfile.FileTextError as e:
        raise ConfigError(file, "", str(e)) from None


def _problems(file: str, error: ValidationError, data: Mapping[str, Any]) -> list[Problem]:
    """One problem per mistake in `error`: a union's branches (pydantic reports each) become
    one, its deepest; a misspelt key says which it may have meant, and a required key it
    stands for is not reported missing as well."""
    groups: dict[str, list[tuple[str, Any]]] = {}
    errors = error.errors()
    inner = {tuple(e["loc"][:-1]) for e in errors if len(e["loc"]) > 1}
    for e in errors:
        if e["type"] == "too_short" and tuple(e["loc"]) in inner:
            continue  # its items were refused: said of each, not as "at least 1 item"
        if e["loc"][:1] == ("params",) and "[key]" in e["loc"] and e["type"] == "string_type":
            continue  # a param name that is no text: `load` says so in its own words
        key, root = _location(e["loc"])
        if e["type"] == YES_NO:  # found by the model, said of its key
            key = root = f"{key}.{e['ctx']['key']}" if key else str(e["ctx"]["key"])
        groups.setdefault(root, []).append((key, e))
    meant: set[str] = set()
    problems = []
    for members in groups.values():
        key, first = max(members, key=lambda m: len(m[1]["loc"]))
        msg = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            section, _, name = key.rpartition(".")
            fields = _fields(section, data)
            close = difflib.get_close_matches(name, fields, n=1)
            if close and close[0] == name:  # a field's second name, both given
                other = _other_names(section, name)
                msg = (f"`{name}` is another name of `{other}`, given too: keep one"
                       if other else f"`{name}` is given twice: keep one")
            elif close:
                meant.add(f"{section}.{close[0]}" if section else close[0])
                msg = f"unknown key `{short(name, 40)}` (did you mean `{close[0]}`?)"
            else:
                where = f"{section} takes" if section else "the file has"
                msg = f"unknown key `{short(name, 40)}` ({where} {', '.join(fields)})"
        elif first["type"] == "missing":
            msg = "required key is missing"
        elif first["type"] in ("union_tag_invalid", "union_tag_not_found"):
            ctx = first["ctx"]
            key = f"{key}.{ctx['discriminator'].strip(chr(39))}" if key else \
                ctx["discriminator"].strip("'")
            msg = (f"one of {ctx['expected_tags'].replace(chr(39), '')}, not "
                   f"{short(repr(ctx['tag']), 40)}" if "tag" in ctx else
                   "required key is missing")
        elif first["type"] == "too_short":
            msg = (f"give at least {first['ctx']['min_length']} "
                   f"(got {short(repr(first.get('input')), 40)})")
        elif first["type"] in ("model_attributes_type", "dict_type", "model_type"):
            msg = f"must be a mapping of keys, not {short(repr(first.get('input')), 40)}"
        elif "input" in first and first["type"] not in ("value_error", YES_NO):
            msg = f"{msg} (got {short(repr(first['input']))})"
        problems.append((first["type"], Problem(file, key, msg)))
    return [p for kind, p in problems if not (kind == "missing" and p.key in meant)]


def _fields(section: str, data: Mapping[str, Any]) -> list[str]:
    """The keys the section at dotted `section` takes (for a param, those of its type)."""
    models: dict[str, type[BaseModel]] = {
        "": Spec, "study": StudySection, "trainer": TrainerSection, "gpus": GpusSection,
        "trainer.accelerate": AccelerateSettings, "trainer.result": ResultSection,
        "trainer.report": ReportSection, "trainer.report.tensorboard": TensorboardSource,
        "trainer.container": containerspec.ContainerSection,
    }
    model = models.get(section)
    parts = section.split(".")
    if section == "study.scheduler":
        given = (data.get("study") or {}).get("scheduler")
        kind = given.get("type") if isinstance(given, dict) else None
        model = SCHEDULER_MODELS.get(kind) if isinstance(kind, str) else None
    if model is None and len(parts) == 2 and parts[0] == "params":
        param = (data.get("params") or {}).get(parts[1])
        kind = param.get("type") if isinstance(param, dict) else None
        model = PARAM_MODELS.get(kind) if isinstance(kind, str) else None
    if model is None:
        return []
    names: list[Any] = []
    for name, field in model.model_fields.items():
        alias = field.validation_alias
        names += list(alias.choices) if isinstance(alias, AliasChoices) else [name]
    return [str(n) for n in dict.fromkeys(names) if n not in NOT_IN_FILES]


SCHEDULER_MODELS: dict[str, type[BaseModel]] = {
    "asha": scheduler_spec.AshaScheduler, "hyperband": scheduler_spec.HyperbandScheduler,
    "pbt": scheduler_spec.PbtScheduler,
}
def _other_names(section: str, name: str) -> str | None:
    """The names, but `name`, of the field of `section` that `name` also names."""
    models: dict[str, type[BaseModel]] = {"study": StudySection, "trainer": TrainerSection}
    model = models.get(section)
    for field in (model.model_fields.values() if model is not None else []):
        alias = field.validation_alias
        if isinstance(alias, AliasChoices) and name in alias.choices:
            return " / ".join(str(n) for n in alias.choices if n != name)
    return None


PARAM_MODELS: dict[str, type[BaseModel]] = {
    "float": FloatParam, "int": IntParam, "categorical": CategoricalParam, "bool": BoolParam,
    "fixed": FixedParam,
}


def _refuse_nul(file: str, value: Any, key: str, problems: list[Problem]) -> None:
    """No string of the file may hold a NUL byte: no argv, environment or path can."""
    if isinstance(value, str) and "\x00" in value:
        problems.append(Problem(file, key, "contains a NUL byte, which no command line, "
                                "environment variable or path can carry"))
    items = value.items() if isinstance(value, dict) else (
        enumerate(value) if isinstance(value, list) else ())
    for k, v in items:
        _refuse_nul(file, k, key, problems)
        _refuse_nul(file, v, f"{key}.{short(str(k), 40)}" if key else short(str(k), 40),
                    problems)


_TAGS = ("function-", "literal[", "list[", "dict[", "constrained-")  # pydantic's union members
_TYPE_TAGS = ("str", "int", "float", "bool", "none")


def _location(loc: tuple[int | str, ...]) -> tuple[str, str]:
    """A pydantic error location as the user's dotted key, without pydantic's tags; and the
    key of the union whose branch it is (the key itself where it is none)."""
    keep: list[int | str] = []
    root = None
    for i, part in enumerate(loc):
        # params.<name>.<type tag>.<key>: the tag is the discriminator pydantic adds, not a key
        if i == 2 and loc[0] == "params" and part in PARAM_TYPES:
            continue
        if i == 2 and loc[:2] == ("study", "scheduler") and part in SCHEDULER_MODELS:
            continue  # study.scheduler.<type tag>.<key>: the same
        # a union's branch: `str`, `list[...]`... (deeper than any key a user names so)
        if isinstance(part, str) and (part.startswith(_TAGS) or (i >= 3 and part in _TYPE_TAGS)):
            root = root if root is not None else ".".join(str(p) for p in keep)
            continue
        keep.append(part)
    key = ".".join(str(p) for p in keep)
    return key, key if root is None else root
