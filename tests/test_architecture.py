"""The layout is the architecture: packages in layers, imports one way, the doc true to the tree.

A module imports only from packages of lower layers, and from its own package without a cycle;
`docs/explanation/architecture.md` lists exactly the packages and modules the tree has.
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
from collections.abc import Iterator
from pathlib import Path

import sweep

PACKAGE = Path(sweep.__file__).parent
DOC = PACKAGE.parent / "docs" / "explanation" / "architecture.md"

# one line per package (or top-level module), lowest first
LAYERS = [
    {"_core", "protocol"},  # import nothing of sweep
    {"spec"},  # the study file -> Spec
    {"gpus"},  # devices, the pool, placement, health, the monitor
    {"trial"},  # one trial as files and processes
    {"launch"},  # how a trial starts: the launchers, the warm server, containers
    {"study"},  # the Optuna storage
    {"schedulers"},  # study.scheduler: its decisions, budget, checkpoint disk, carrying out
    {"runner"},  # the driver's loop and its policy
    {"analysis"},  # summary, figures, report
    {"commands"},  # one module per verb, and a run put together (assembly)
    {"cli"},
    {"__main__", "__init__"},
]


def modules() -> Iterator[tuple[str, Path]]:
    """Every module of sweep but `testing`, as a dotted name under sweep (`trial.process`)."""
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] != "testing" and "__pycache__" not in rel.parts:
            yield ".".join(rel.with_suffix("").parts), path


@functools.cache
def parsed(path: Path) -> ast.Module:
    """A source file's syntax tree, parsed once per process (the checks only read it)."""
    return ast.parse(path.read_text())


def part_of(name: str) -> str:
    """The package (or top-level module) a dotted module name belongs to."""
    return name.split(".")[0]


def face_of(package: str) -> dict[str, str]:
    """The names a package's `__init__` re-exports (its face, `_core.faces`), each with the
    module that defines it, dotted under sweep (`trial.outcome`)."""
    init = PACKAGE / package / "__init__.py"
    if not init.exists():
        return {}
    checking = [block for block in parsed(init).body if isinstance(block, ast.If)
                and getattr(block.test, "id", "") == "TYPE_CHECKING"]
    return {alias.name: node.module.split(".", 1)[1]
            for block in checking for node in ast.walk(block)
            if isinstance(node, ast.ImportFrom) and node.module
            and node.module.startswith(f"sweep.{package}.") for alias in node.names}


def sweep_imports(path: Path) -> set[str]:
    """The sweep modules `path` imports, dotted under sweep (TYPE_CHECKING imports too); a name
    taken from a package's face counts as an import of the module that defines it."""
    found = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sweep"):
            base = node.module.split(".")[1:]
            for alias in node.names:
                whole = ".".join([*base, alias.name])
                face = face_of(base[0]) if len(base) == 1 else {}
                found.add(whole if (PACKAGE / f"{whole.replace('.', '/')}.py").exists()
                          else face.get(alias.name) or ".".join(base) or alias.name)
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".", 1)[1] for a in node.names if a.name.startswith("sweep.")}
    return {f for f in found if part_of(f) not in ("testing", "__version__")}


def test_every_package_has_a_layer_and_says_its_job():
    layer_of = {name: i for i, layer in enumerate(LAYERS) for name in layer}
    parts = {part_of(name) for name, _ in modules()}
    assert parts == set(layer_of), "a package or module without a layer: place it in LAYERS"
    for init in PACKAGE.glob("*/__init__.py"):
        if init.parent.name != "testing":
            doc = ast.get_docstring(parsed(init))
            assert doc and "Imports" in doc, f"{init}: say the package's job and its imports"


def said_imports(doc: str) -> set[str]:
    """The packages a package docstring's "Imports ..." sentence names ("Imports nothing of
    sweep": none)."""
    m = re.search(r"\bImports\b(.*?)(?:[.;]\s|[.;]?$)", doc, flags=re.S)
    assert m, "no 'Imports ...' sentence"
    named = set(re.findall(r"[A-Za-z_]+", m.group(1)))
    return {name for layer in LAYERS for name in layer} & named


def test_each_package_imports_what_its_docstring_says():
    """Issue 39: a package's "Imports ..." sentence is the packages it imports, no more, no
    fewer (TYPE_CHECKING imports count: they are a dependency too)."""
    wrong = []
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        package = init.parent.name
        if package == "testing":
            continue
        measured = {part_of(i) for name, path in modules() if part_of(name) == package
                    for i in sweep_imports(path)} - {package}
        said = said_imports(ast.get_docstring(parsed(init)) or "")
        if said != measured:
            wrong.append(f"{package}: says {sorted(said)}, imports {sorted(measured)}")
    assert not wrong, wrong


def third_party_imports(path: Path) -> set[str]:
    """The top-level names of what `path` imports from outside sweep (TYPE_CHECKING too)."""
    found = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
    return found - {"sweep"}


def test_what_a_package_says_it_never_imports_it_never_imports():
    """Issue 39: a package docstring's "never Optuna" (or any library it names so) holds for
    every module of the package; "of Optuna only `X`" names the one name it takes."""
    wrong = []
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        package = init.parent.name
        doc = ast.get_docstring(parsed(init)) or ""
        never = {w.lower() for w in re.findall(r"\bnever `?([A-Za-z_]+)`?", doc)}
        only = dict(re.findall(r"\bof ([A-Za-z_]+) only `([A-Za-z_]+)`", doc))
        for name, path in modules():
            if part_of(name) != package:
                continue
            for lib in never & third_party_imports(path):
                wrong.append(f"{name} imports {lib}, which sweep/{package} says it never does")
            tree = parsed(path)
            for lib, allowed in only.items():
                taken = {a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                         and node.module and node.module.split(".")[0] == lib.lower()
                         for a in node.names}
                taken |= {lib.lower() for node in ast.walk(tree) if isinstance(node, ast.Import)
                          for a in node.names if a.name.split(".")[0] == lib.lower()}
                if taken - {allowed}:
                    wrong.append(f"{name} takes {sorted(taken - {allowed})} of {lib}, and "
                                 f"sweep/{package} says only {allowed}")
    assert not wrong, wrong
    # the check reads the claims it is meant to: launch says never Optuna, trial only TrialState
    launch = ast.get_docstring(parsed(PACKAGE / "launch" / "__init__.py"))
    trial = ast.get_docstring(parsed(PACKAGE / "trial" / "__init__.py"))
    assert "never Optuna" in (launch or "") and "of Optuna only `TrialState`" in (trial or "")


def test_imports_go_one_way():
    layer_of = {name: i for i, layer in enumerate(LAYERS) for name in layer}
    upward = []
    for name, path in modules():
        for imported in sweep_imports(path):
            mine, theirs = part_of(name), part_of(imported)
            if mine != theirs and layer_of[theirs] >= layer_of[mine]:
                upward.append(f"{name} -> {imported}")
    assert not upward, upward


def test_no_import_cycle_inside_a_package():
    graph = {name: {i for i in sweep_imports(path) if part_of(i) == part_of(name) and i != name}
             for name, path in modules()}
    done: set[str] = set()

    def visit(node: str, stack: list[str]) -> None:
        if node in stack:
            raise AssertionError(" -> ".join([*stack[stack.index(node):], node]))
        if node in done:
            return
        for nxt in graph.get(node, ()):
            visit(nxt, [*stack, node])
        done.add(node)

    for name in graph:
        visit(name, [])


def test_how_a_trial_starts_is_launch_and_its_contract_has_a_module_of_its_own():
    """Every launcher is in `launch/`; `launch/launcher.py` holds the `Launcher` contract alone."""
    elsewhere = [name for name, path in modules() if part_of(name) != "launch"
                 for node in ast.walk(parsed(path))
                 if isinstance(node, ast.ClassDef) and node.name.endswith("Launcher")]
    assert not elsewhere, elsewhere
    contract = parsed(PACKAGE / "launch" / "launcher.py")
    assert [n.name for n in contract.body if isinstance(n, ast.ClassDef)] == ["Launcher"]


def test_no_two_classes_share_a_name():
    seen: dict[str, str] = {}
    twice = []
    for name, path in modules():
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.ClassDef):
                if node.name in seen:
                    twice.append(f"{node.name}: {seen[node.name]} and {name}")
                seen[node.name] = name
    assert not twice, twice


def documented() -> dict[str, str]:
    """The modules the architecture doc's tree lists, each with the package line above it."""
    block = DOC.read_text().split("```")[1]
    found, package = {}, ""
    for line in block.splitlines():
        if m := re.match(r"^  ([a-z_]+)/\s", line + " "):
            package = m.group(1)
        elif m := re.match(r"^    ([a-z_]+)\.py\s", line + " "):
            found[f"{package}.{m.group(1)}"] = package
        elif m := re.match(r"^  ([a-z_]+)\.py\s", line + " "):
            found[m.group(1)] = m.group(1)
    return found


def test_the_architecture_doc_lists_the_tree():
    tree = {name for name, _ in modules() if not name.endswith("__init__")} - {"__main__"}
    assert set(documented()) == tree


def test_the_tests_mirror_the_packages():
    """Issue 39: `tests/<package>/test_<module>.py`, `tests/e2e/` for the files that start real
    processes; at tests/ itself only the tests of the top-level modules (`sweep`'s API, cli,
    protocol) and of the repository as a whole; no two test files of one name (pytest imports
    each by its name)."""
    tests = PACKAGE.parent / "tests"
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    folders = {p.name for p in tests.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders - packages == {"e2e", "trainers", "examples"}
    assert {p.stem for p in tests.glob("test_*.py")} == {
        "test_api", "test_architecture", "test_cli", "test_cluster", "test_docs", "test_protocol"}
    names = [p.name for p in tests.rglob("test_*.py")]
    assert len(names) == len(set(names))


def test_every_verb_is_one_module_of_commands():
    """Issue 39: one module per verb (as accelerate's and pipx's `commands/`), holding its
    arguments (`add_parser`) and its work (`main`); the command line has no verb of its own."""
    import argparse

    from sweep import cli
    from sweep.commands import COMMANDS

    made = []
    for command in COMMANDS:
        verb = command.add_parser(argparse.ArgumentParser().add_subparsers())
        made.append(verb.prog.split()[-1])
        assert made[-1] == command.__name__.rsplit(".", 1)[1].replace("_", "-")
        assert verb.get_default("func") is command.main
    verbs = next(a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert list(verbs.choices) == made


# modules still over MAX_LINES, each to be split by job (issue 39)
LONG: set[str] = set()
MAX_LINES = 450


def test_a_module_is_at_most_450_lines():
    long = {name for name, path in modules()
            if len(path.read_text().splitlines()) > MAX_LINES}
    assert long <= LONG, sorted(long - LONG)


def calls_in(path: Path, methods: set[tuple[str, str]]) -> set[str]:
    """The top-level functions and classes of `path` that call one of `methods` ((what it is
    called on, named as the code names it: `store`, `self.store`; the method))."""
    found = set()
    for top in parsed(path).body:
        for node in ast.walk(top):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                on = node.func.value
                name = on.attr if isinstance(on, ast.Attribute) else getattr(on, "id", "")
                if (name, node.func.attr) in methods:
                    found.add(getattr(top, "name", "<module>"))
    return found


def test_one_place_in_the_runner_ends_a_trial():
    """Every way out of a trial the runner ends, the driver's own and a dead driver's, goes
    through `_trials.Trials` (`finish`): the one place that tells one, discards its heartbeat
    and gives its lease back (the store's telling forms are the storage shim); a scheduler
    decides and records, and never ends one itself."""
    ways_out = {("store", "tell"), ("store", "tell_failed"), ("store", "tell_verdict"),
                ("store", "fail_orphan"), ("pool", "release"), ("heartbeat", "discard")}
    where = {(name, place) for name, path in modules()
             if part_of(name) in ("runner", "schedulers")
             for place in calls_in(path, ways_out)}
    assert where == {("runner._trials", "Trials")}


def test_the_driver_is_given_its_collaborators_whole():
    """Driver.__init__ sets at most 15 attributes, each its own (`self.x`), and the driver
    never rewires a collaborator after building it (`self.x.y = ...`, `monitor.on_sick =`)."""
    tree = parsed(PACKAGE / "runner" / "driver.py")
    [driver] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Driver"]
    [init] = [n for n in driver.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]

    def targets(node: ast.AST) -> list[ast.expr]:
        found: list[ast.expr] = []
        for n in ast.walk(node):
            if isinstance(n, ast.Assign):
                for t in n.targets:
                    found += t.elts if isinstance(t, ast.Tuple) else [t]
            elif isinstance(n, (ast.AnnAssign, ast.AugAssign)):
                found.append(n.target)
        return found

    own = {t.attr for t in targets(init) if isinstance(t, ast.Attribute)
           and isinstance(t.value, ast.Name) and t.value.id == "self"}
    others = [ast.unparse(t) for t in targets(init) if isinstance(t, ast.Attribute)
              and not (isinstance(t.value, ast.Name) and t.value.id == "self")]
    assert len(own) <= 15 and not others, (sorted(own), others)
    rewired = [ast.unparse(t) for t in targets(tree) if isinstance(t, ast.Attribute)
               and isinstance(t.value, ast.Attribute) and isinstance(t.value.value, ast.Name)
               and t.value.value.id == "self"]
    assert not rewired, rewired


def test_no_scheduler_is_tested_for_none_in_the_runner():
    """A study without study.scheduler has `NoScheduler`: the runner and the schedulers ask
    the scheduler object, never whether there is one (the study file's setting,
    `study.scheduler`, is read where the object is made)."""
    tests = re.compile(r"(?<!study\.)\bschedul\w* is (not )?None")
    found = [f"{name}: {line.strip()}" for name, path in modules()
             if part_of(name) in ("runner", "schedulers")
             for line in path.read_text().splitlines() if tests.search(line)]
    assert not found, found


def test_reading_a_study_back_never_reaches_into_a_run():
    """Issue 39: `analysis` imports nothing of `runner`, and of `schedulers` only modules that
    import none of its carrying out (`run`, `api` and the private ones), directly or through
    another: the pure decisions and the lineages' history, never the package's face."""
    carrying_out = {name for name, _ in modules() if part_of(name) == "schedulers"
                    and (name.split(".")[1] in ("run", "api", "__init__")
                         or name.split(".")[1].startswith("_"))}
    inside = {name: {i for i in sweep_imports(path) if part_of(i) == "schedulers"}
              for name, path in modules() if part_of(name) == "schedulers"}

    def reaches(name: str, seen: frozenset[str] = frozenset()) -> set[str]:
        found = {name} if name in carrying_out or name == "schedulers" else set()
        for nxt in inside.get(name, set()) - seen:
            found |= reaches(nxt, seen | {name})
        return found

    wrong = [f"{name} -> {imported}" for name, path in modules() if part_of(name) == "analysis"
             for imported in sweep_imports(path)
             if part_of(imported) == "runner"
             or (part_of(imported) == "schedulers" and reaches(imported))]
    assert not wrong, wrong


def test_a_private_module_is_imported_only_inside_its_package():
    """A module whose name starts with `_` is its package's own: no other package imports it
    (the package's `__init__` re-exports what other layers use)."""
    wrong = [f"{name} -> {imported}" for name, path in modules()
             for imported in sweep_imports(path)
             if part_of(imported) != part_of(name)
             and any(part.startswith("_") for part in imported.split(".")[1:])]
    assert not wrong, wrong


SETTERS = {"set_user_attr", "set_system_attr", "set_trial_user_attr", "set_trial_system_attr",
           "set_study_user_attr", "set_study_system_attr"}


def stored_names() -> tuple[set[str], set[str]]:
    """The attribute names of `sweep._core.names`: (those of two words or more, `retry_of`,
    which sweep writes for nothing else; one-word ones, `gpu`, `host`, common words that are
    a stored attribute only where one is read or written)."""
    from sweep._core import names

    found = {v for k, v in vars(names).items() if k.isupper() and isinstance(v, str)}
    return {n for n in found if "_" in n}, {n for n in found if "_" not in n}


def _tail(node: ast.AST) -> str:
    """The last name of an expression (`t.user_attrs` -> `user_attrs`), lowercase."""
    while isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr.lower()
    return node.id.lower() if isinstance(node, ast.Name) else ""


def _is_attrs(node: ast.AST) -> bool:
    """Whether an expression names a trial's or a study's attributes (`user_attrs`, `attrs`)."""
    return _tail(node).endswith(("attrs", "attr"))


def attribute_keys(tree: ast.AST) -> Iterator[ast.Constant]:
    """The string constants of `tree` used as an attribute's name: a key of a mapping of
    attributes (`t.user_attrs["gpu"]`, `.get("gpu")`, `"gpu" in attrs`, `attrs = {"gpu": ..}`,
    `user_attrs={"gpu": ..}`, a dict an `..attr(s)` function returns, one given to `note`),
    or an argument of Optuna's `set_*_attr`."""
    for node in _keys(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node


def _keys(tree: ast.AST) -> Iterator[ast.AST]:
    dicts: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and _is_attrs(node.value):
            yield node.slice
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in SETTERS:
                yield from node.args
            elif node.func.attr in ("get", "pop", "setdefault") and _is_attrs(node.func.value):
                yield from node.args[:1]
            elif node.func.attr == "note" or (node.func.attr == "update"
                                              and _is_attrs(node.func.value)):
                dicts += node.args
        if isinstance(node, ast.Call):
            dicts += [k.value for k in node.keywords if k.arg and k.arg.endswith("attrs")]
        elif isinstance(node, ast.Compare) and any(
                isinstance(op, ast.In | ast.NotIn) for op in node.ops):
            if _is_attrs(node.comparators[0]):
                yield node.left
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if node.value is not None and any(_is_attrs(t) for t in targets):
                dicts.append(node.value)
        elif isinstance(node, ast.FunctionDef) and "attr" in node.name:
            dicts += [r.value for r in ast.walk(node)
                      if isinstance(r, ast.Return) and r.value is not None]
    for d in dicts:
        if isinstance(d, ast.Dict):
            yield from (k for k in d.keys if k is not None)


def test_stored_attribute_names_are_spelled_only_in_the_names_module():
    """A stored attribute's name is written out only in `sweep/_core/names.py`: a name of
    two words or more anywhere in sweep (but a docstring), a one-word name where it is an
    attribute's key (`attribute_keys`)."""
    words, common = stored_names()
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "_core" / "names.py" or "__pycache__" in path.parts:
            continue
        tree = parsed(path)
        keys = {id(c) for c in attribute_keys(tree)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                    node.value in words or (node.value in common and id(node) in keys)):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value!r}")
    assert not found, "use sweep._core.names: " + ", ".join(found)


def test_the_names_check_finds_a_name_written_out():
    """The check above finds what it is for (and passes a common word that is no key)."""
    tree = ast.parse('t.user_attrs.get("gpu"); x = {"gpu": 1}; trial.set_user_attr("host", 1)\n'
                     'attrs: dict = {"owner": 1}; study.enqueue_trial(p, user_attrs={"rung": 2})'
                     '\n"dir" in t.user_attrs; store.note(t, {"clean": True}); row["gpu"] = 1')
    assert sorted(c.value for c in attribute_keys(tree)) == [
        "clean", "dir", "gpu", "host", "owner", "rung"]


# modules other packages never import that keep a public name: what users import by name
# (the docs' `sweep.analysis.*`), and what runs by its name or its file (the warm server by
# `python -m`, the guard by path)
PUBLIC_THOUGH_UNIMPORTED = {"analysis.summary", "analysis.figures", "analysis.report",
                            "analysis.lineage_figures", "launch.warm_server", "trial.guard"}


def test_a_module_no_other_package_imports_is_private():
    """Issue 39, the converse of the rule above: a module only its own package imports is the
    package's own, named with a leading `_`. Public are the modules another package imports,
    those the package's `__init__` re-exports (its face: `commands`' verbs, `schedulers.api`)
    and those a user or another process reaches by name (`PUBLIC_THOUGH_UNIMPORTED`)."""
    from_outside = {imported for name, path in modules() for imported in sweep_imports(path)
                    if part_of(imported) != part_of(name) or name.endswith(".__init__")}
    wrong = [name for name, _ in modules()
             if "." in name and not name.rsplit(".", 1)[1].startswith("_")
             and name not in from_outside | PUBLIC_THOUGH_UNIMPORTED]
    assert not wrong, f"only their own package imports these: name them _x.py: {wrong}"


# a name that is also its module's name cannot be re-exported (importing the module would
# replace it in the package): taken from the module itself
OWN_NAMED = {("analysis", "status", "status"), ("study", "connect", "connect")}


def test_another_package_takes_a_name_through_the_packages_face():
    """Issue 39: `from sweep.trial import Outcome`, never `from sweep.trial.outcome import
    Outcome`, across packages; a package's face (its `__init__`) lists in `__all__` exactly
    the names it imports for type checkers, and each loads, on first use, as its module
    defines it."""
    reached = []
    for name, path in modules():
        for node in ast.walk(parsed(path)):
            if not (isinstance(node, ast.ImportFrom) and node.module
                    and node.module.startswith("sweep.") and node.module.count(".") >= 2):
                continue
            _, package, module = node.module.split(".", 2)
            if package in (part_of(name), "testing") or not (PACKAGE / package).is_dir():
                continue
            if all((package, module, a.name) in OWN_NAMED for a in node.names):
                continue
            reached.append(f"{name}: from {node.module} import ...")
    assert not reached, reached
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        package = init.parent.name
        if package == "testing":
            continue
        face = face_of(package)
        loaded = importlib.import_module(f"sweep.{package}")
        assert set(loaded.__all__) - {"COMMANDS"} == set(face), package
        for name, module in face.items():  # each name is the one its module defines
            defined = getattr(importlib.import_module(f"sweep.{module}"), name)
            assert getattr(loaded, name) is defined, (package, name)
