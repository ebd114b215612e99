"""A study in storage + its GPU samples -> pandas DataFrames, a CSV and a terminal table.

    from sweep.analysis.summary import load
    s = load("studies/quickstart.yaml")   # works while the sweep is still running
    s.trials, s.gpus, s.samples           # DataFrames

Only reads: storage through Optuna, the drivers' `<output_dir>/drivers/*/gpu_samples.csv`.
Writing the CSV is `save`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

from sweep._core import names, userfiles
from sweep._core.errors import UsageError
from sweep.spec import config
from sweep.spec.schema import Spec
from sweep.spec.storageurl import StorageKind
from sweep.study import attrs, storage

# the trial's attributes shown as they are stored, each a column of its name
ATTR_COLUMNS = [names.GPU, names.GPUS, names.EXIT_CODE, names.FAIL_REASON, *names.USAGE,
                names.ATTEMPT, names.RETRY_OF, *names.RAN]


# study.scheduler's records (`names.SCHEDULER_RECORDS`): a paused attempt's step, a PBT
# exploit's donor, a continuation that did not resume from its checkpoint, and an exploit that
# ran with its donor's params (`name=logged value`)
SCHEDULER_COLUMNS = [names.PAUSED_AT, names.EXPLOIT_OF, names.RESUMED_AT,
                     names.STEPS_REPEATED, names.RESTORED_PARAMS]
# trial numbers and counts that a row may lack (a trial an older sweep left RUNNING has no
# attempt): integers still, not floats
INTEGER_COLUMNS = (names.ATTEMPT, names.RETRY_OF, names.RERUN_OF, names.CONTINUES)
MAX_RESULT_COLUMNS = 3  # other result keys shown in the terminal table (all are in the CSV)


@dataclass
class Summary:
    """One row per trial (`trials`), one per device (`gpus`), and the raw `samples`."""

    spec: Spec
    trials: pd.DataFrame
    gpus: pd.DataFrame
    samples: pd.DataFrame

    def save(self, path: Path | None = None) -> Path:
        """Write the trials table as CSV (default `<output_dir>/summary.csv`), never over a
        file sweep did not write, nor the study's own files (`own_files`,
        `userfiles.replace_output`)."""
        path = path or self.spec.output_dir / "summary.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        userfiles.replace_output(path, self.trials.to_csv(index=False), own_files(self.spec))
        return path


SQLITE_FILES = ("-journal", "-wal", "-shm")  # what SQLite keeps beside its file


def own_files(spec: Spec) -> list[tuple[Path, str]]:
    """The study's own files, which nothing sweep writes for the user may replace or make,
    each with what it is, whether it is there now or not: its study file, and, for a file
    storage, its file, the files SQLite keeps beside it (`-journal`, `-wal`, `-shm`) or the
    journal's lock (`<file>.lock`, Optuna's), and sweep's budget lock (`lock_path`)."""
    found = [(spec.source, "the study file")]
    file = spec.storage.file
    if file is None:
        return found
    found.append((file, "the study's storage"))
    if spec.storage.kind is StorageKind.SQLITE:
        found += [(Path(f"{file}{end}"), f"the study's storage's {end} file")
                  for end in SQLITE_FILES]
    else:
        found.append((Path(f"{file}.lock"), "the study's storage's lock"))
    if spec.storage.lock_path is not None:
        found.append((spec.storage.lock_path, "sweep's budget lock of the study's storage"))
    return found


def load(study_file: str | Path, storage: str | None = None) -> Summary:
    """Read a study file's study and samples; raise UsageError if it has not run yet."""
    spec = config.load(study_file, runnable=False, storage=storage)
    study = load_study(spec)
    trials = trials_frame(study, spec)
    samples = read_samples(spec.output_dir)
    return Summary(spec, trials, gpu_table(trials, samples, spec.study.reclaim_seconds),
                   samples)


def load_study(spec: Spec) -> Any:
    """The stored study of `spec`, read only; UsageError if it has not run yet."""
    study = storage.read_study(spec)
    if study is None:
        raise UsageError(f"{spec.source}: no study named {spec.study.name!r} in "
                         f"{spec.storage.shown} yet; run the study first")
    return study


def seconds(start: datetime | None, end: datetime | None) -> float:
    """From `start` to `end` in seconds; NaN where either is unknown."""
    if start is None or end is None:
        return math.nan
    return (end - start).total_seconds()


def trials_frame(study: Any, spec: Spec) -> pd.DataFrame:
    """One row per trial with the columns the README documents."""
    metrics = spec.study.objective_metrics
    multi = len(metrics) > 1
    front = {t.number for t in study.best_trials} if multi else set()
    rows = []
    for t in study.get_trials(deepcopy=False):
        row: dict[str, Any] = {"number": t.number, "state": t.state.name}
        values = t.values or [math.nan] * len(metrics)
        if multi:
            row.update({f"values_{m}": v for m, v in zip(metrics, values, strict=True)})
            row["pareto"] = t.number in front
        else:
            row["value"] = values[0]
        row.update({f"params_{k}": v for k, v in t.params.items()})
        record = attrs.OwnerRecord.of(t.user_attrs)
        for key in ATTR_COLUMNS:
            row[key] = t.user_attrs.get(key)
        if row[names.GPU] is None and record is not None:  # running: its place is in the record
            row[names.GPU], row[names.GPUS] = record.gpu, record.gpus
        row["datetime_start"] = t.datetime_start
        row["datetime_complete"] = t.datetime_complete
        row["duration_s"] = seconds(t.datetime_start, t.datetime_complete)
        row[names.HOST] = t.user_attrs.get(names.HOST) or (record.owner.host if record else None)
        row[names.RERUN_OF] = t.user_attrs.get(names.RERUN_OF)
        row[names.CONTINUES] = t.user_attrs.get(names.CONTINUES)
        alive = t.user_attrs.get(names.ALIVE_UNTIL)
        row[names.ALIVE_UNTIL] = (datetime.fromtimestamp(alive)
                                  if isinstance(alive, int | float) else None)
        for key in SCHEDULER_COLUMNS:
            row[key] = t.user_attrs.get(key)
        restored = row[names.RESTORED_PARAMS]
        if isinstance(restored, dict):
            row[names.RESTORED_PARAMS] = ", ".join(f"{k}={v:g}" for k, v in restored.items())
        row.update({k: v for k, v in t.user_attrs.items() if k.startswith(names.METRIC_PREFIX)})
        rows.append(row)
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    params = [c for c in frame.columns if c.startswith("params_")]
    order = ["number", "state", *[c for c in frame.columns if c.startswith(("value", "pareto"))],
             *params, names.GPU, names.GPUS, "datetime_start", "datetime_complete", "duration_s",
             *[c for c in ATTR_COLUMNS if c not in (names.GPU, names.GPUS)], names.HOST,
             names.ALIVE_UNTIL, names.RERUN_OF,
             *sorted(c for c in frame.columns if c.startswith(names.METRIC_PREFIX)),
             names.CONTINUES, *SCHEDULER_COLUMNS]
    frame = _with_lineages(frame[order])
    for col in (*names.USAGE, "duration_s"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce")
    for col in ("datetime_start", "datetime_complete", names.ALIVE_UNTIL):  # all None: times
        frame[col] = frame[col].astype("datetime64[us]")
    for col in (names.GPU, names.EXIT_CODE):
        frame[col] = pd.array(frame[col], dtype="Int64")
    for col in INTEGER_COLUMNS:
        frame[col] = pd.array(frame[col], dtype="Int64")
    return frame


def _with_lineages(frame: pd.DataFrame) -> pd.DataFrame:
    """Add each trial's lineage (`lineage`: its first attempt's number; see `sweep.trial.lineage`),
    how many attempts the lineage has had (`lineage_attempts`) and the device-seconds they
    took together (`lineage_device_s`: each attempt's duration, until its driver's last sign
    of life for one a reclaim told, times its devices; a running one counts as far as it is
    known)."""
    frame = frame.copy()
    origin = pd.to_numeric(frame[names.RETRY_OF], errors="coerce")
    frame["lineage"] = pd.array(origin.fillna(frame["number"]), dtype="Int64")
    width = frame[names.GPUS].map(lambda g: len(str(g).split(",")) if isinstance(g, str) else 1)
    seconds = pd.to_numeric(frame["duration_s"], errors="coerce")
    alive = pd.to_datetime(frame[names.ALIVE_UNTIL]) - pd.to_datetime(frame["datetime_start"])
    seconds = seconds.mask(alive.notna(), alive.dt.total_seconds().clip(lower=0.0))
    device_s = seconds.fillna(0.0) * width
    by = frame.groupby("lineage")
    frame["lineage_attempts"] = by["number"].transform("count")
    frame["lineage_device_s"] = device_s.groupby(frame["lineage"]).transform("sum")
    return frame


def last_seen(samples: pd.DataFrame) -> pd.Series:
    """When the GPU samples last showed each trial holding a device, by trial number: the
    last sign of life of a trial whose driver died."""
    if samples.empty:
        return pd.Series(dtype="datetime64[us]")
    held = samples.assign(trial=samples["trials"].astype(str).str.split(";")).explode("trial")
    held = held[held["trial"].str.fullmatch(r"\d+", na=False)]
    return held.groupby(held["trial"].astype(int))["time"].max()


def ends(trials: pd.DataFrame, samples: pd.DataFrame, reclaim_seconds: float = math.inf,
         now: datetime | None = None) -> pd.Series:
    """When each trial stopped holding its devices: when it was told; for one a reclaim told,
    its driver's last sign of life (`alive_until`); for a running one, `now` (default: now),
    unless its driver is gone (the GPU `samples` have not shown it for `reclaim_seconds`):
    the last sample that did. NaT for a trial not started."""
    moment = pd.Timestamp(now or datetime.now())
    end = trials["datetime_complete"].astype("datetime64[ns]")
    state = trials["state"] if "state" in trials else end.isna().map(
        {True: "RUNNING", False: "COMPLETE"})  # a frame of times only: the open ones run
    if names.ALIVE_UNTIL in trials:
        reclaimed = (state == "FAIL") & trials[names.ALIVE_UNTIL].notna()
        end = end.mask(reclaimed, trials[[names.ALIVE_UNTIL, "datetime_start"]].astype(
            "datetime64[ns]").max(axis=1))
    running = state == "RUNNING"
    end = end.mask(running, moment)
    if running.any() and "number" in trials:
        seen = pd.to_datetime(trials["number"].map(last_seen(samples).to_dict())).astype(
            "datetime64[ns]")
        gone = running & seen.notna() & (
            (moment - seen).dt.total_seconds() > reclaim_seconds)
        end = end.mask(gone, seen)
    return end


def read_samples(output_dir: Path) -> pd.DataFrame:
    """The samples of every driver that ran with this `output_dir` (sweep 0.2's single
    `gpu_samples.csv` too); an empty frame with the right columns if there are none yet.

    `time` is naive local time, like Optuna's `datetime_start`, so the two can be compared.
    """
    from sweep.gpus.monitor import SAMPLE_COLUMNS, SAMPLES_NAME

    files = sorted(output_dir.glob(f"drivers/*/{SAMPLES_NAME}"))
    if (output_dir / SAMPLES_NAME).is_file():
        files.insert(0, output_dir / SAMPLES_NAME)
    frames = [pd.read_csv(f, dtype={"trials": "string", "host": "string"},
                          on_bad_lines="skip") for f in files]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=SAMPLE_COLUMNS)
    samples = pd.concat(frames, ignore_index=True)
    if "host" not in samples:
        samples["host"] = pd.NA
    samples = samples[SAMPLE_COLUMNS]
    samples["trials"] = samples["trials"].fillna("")
    local = datetime.now().astimezone().tzinfo
    samples["time"] = (
        pd.to_datetime(samples["time"], unit="s", utc=True).dt.tz_convert(local)
        .dt.tz_localize(None)
    )
    return samples.sort_values("time", kind="stable", ignore_index=True)


def _union_seconds(intervals: list[tuple[pd.Timestamp, pd.Timestamp]]) -> float:
    total, end = 0.0, None
    for start, stop in sorted(intervals):
        if end is not None and start < end:
            if stop > end:
                total += (stop - end).total_seconds()
                end = stop
        else:
            total += (stop - start).total_seconds()
            end = stop
    return total


def gpu_table(trials: pd.DataFrame, samples: pd.DataFrame,
              reclaim_seconds: float = math.inf) -> pd.DataFrame:
    """Per device of each host: trials run, busy fraction of the sweep's wall time,
    utilisation, idle hours.

    Wall time runs from the first trial's start to the last trial's end (`ends`: now, while
    trials run; a dead driver's trial at its last sign of life);
    a device is busy while it holds at least one trial. `util_mean_busy` is the mean sampled
    utilisation while busy (NaN without NVML).
    """
    columns = ["host", "gpu", "trials", "busy_s", "busy_fraction", "util_mean_busy",
               "idle_gpu_hours"]
    if trials.empty or trials["datetime_start"].isna().all():
        return pd.DataFrame(columns=columns)
    started = trials.dropna(subset=["datetime_start", "gpu"]).copy()
    if started.empty:
        return pd.DataFrame(columns=columns)
    started["host"] = started["host"].fillna("").astype(str) if "host" in started else ""
    samples = samples.copy()
    if not samples.empty:
        hosts = set(started["host"])
        # sweep 0.2's samples name no host: they are the one host's, if the trials have one
        samples["host"] = samples["host"].fillna(hosts.pop() if len(hosts) == 1 else "")
        samples["host"] = samples["host"].astype(str)
    until = ends(started, samples, reclaim_seconds)
    wall = (until.max() - started["datetime_start"].min()).total_seconds()
    places = set(zip(started["host"], started["gpu"].astype(int), strict=True))
    if not samples.empty:
        places |= set(zip(samples["host"], samples["gpu"].astype(int), strict=True))
    devices = [_devices(g, gs) for g, gs in zip(started["gpu"], started["gpus"], strict=True)] \
        if "gpus" in started else [[int(g)] for g in started["gpu"]]
    for host, many in zip(started["host"], devices, strict=True):
        places |= {(host, g) for g in many}
    rows = []
    for host, gpu in sorted(places):
        on = [gpu in many for many in devices]
        mine = started[(started["host"] == host) & pd.Series(on, index=started.index, dtype=bool)]
        intervals = list(zip(mine["datetime_start"], until[mine.index], strict=True))
        busy = _union_seconds(intervals)
        util = math.nan
        if not samples.empty:
            held = samples[(samples["host"] == host) & (samples["gpu"] == gpu)
                           & (samples["trials"] != "")]
            if held["util_gpu"].notna().any():
                util = float(held["util_gpu"].mean())
        rows.append({
            "host": host, "gpu": gpu, "trials": len(mine), "busy_s": busy,
            "busy_fraction": busy / wall if wall > 0 else math.nan,
            "util_mean_busy": util, "idle_gpu_hours": max(0.0, wall - busy) / 3600,
        })
    return pd.DataFrame(rows, columns=columns)


def _devices(gpu: Any, gpus: Any) -> list[int]:
    """All devices of a trial: its `gpus` ("0,1") when it had several, else its `gpu`."""
    if isinstance(gpus, str) and gpus:
        return [int(g) for g in gpus.split(",")]
    return [int(gpu)]


def best_rows(summary: Summary, top: int = 5) -> pd.DataFrame:
    """The best finished trials: the Pareto front for several objectives, else the top values."""
    t = summary.trials
    if t.empty:
        return t
    done = t[t["state"] == "COMPLETE"]
    if "pareto" in t.columns:
        return done[done["pareto"]]
    ascending = summary.spec.study.objective_directions[0] == "minimize"
    return done.sort_values("value", ascending=ascending).head(top)


def _stopped_early(summary: Summary, t: Any, top: int, failed: int) -> Any:
    """The table of a study none of whose trials completed, of those stopped early (PRUNED:
    pruned, or paused at a rung and never promoted to the end), the best by their last value
    first; `failed`: how many others failed."""
    pruned = t[t["state"] == "PRUNED"]
    if "value" in pruned:
        minimize = summary.spec.study.objective_directions[0] == "minimize"
        pruned = pruned.sort_values("value", ascending=minimize)
    cols = [c for c in ("number", "value", names.PAUSED_AT, names.GPU, "duration_s")
            if c in pruned and pruned[c].notna().any()]
    none = ", and none failed" if not failed else f" ({failed} failed, below)"
    return _table(pruned[cols].head(top),
                  f"no COMPLETE trial yet{none}: {len(pruned)} stopped early "
                  "(pruned, or paused at a rung); the best by their last value")


def render(summary: Summary, top: int = 5) -> Any:
    """The terminal view: state counts, the best trials (or the Pareto front), the GPUs."""
    from rich.console import Group
    from rich.text import Text

    t = summary.trials
    counts = t["state"].value_counts().to_dict() if not t.empty else {}
    head = f"[bold]{summary.spec.study.name}[/]: " + (
        ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no trials yet"
    )
    best = best_rows(summary, top)
    if best.empty and not t.empty:  # nothing finished well: the best stopped, why others failed
        failed = t[t["state"] == "FAIL"]
        shown = []
        if (t["state"] == "PRUNED").any():  # pruned, or paused at a rung
            shown.append(_stopped_early(summary, t, top, len(failed)))
        if not failed.empty:
            last = failed.tail(top)
            shown.append(_table(last[["number", names.GPU, "duration_s", names.FAIL_REASON]],
                                f"{'the' if shown else 'no COMPLETE trial yet; the'} last "
                                f"{len(last)} failures"))
        return Group(head, *shown, _table(summary.gpus, "GPUs"))
    title = "Pareto front" if "pareto" in t.columns else f"best {top}"
    show = [c for c in best.columns if c.startswith(("number", "value", "params_"))]
    extras = [c for c in best.columns if c.startswith(names.METRIC_PREFIX)
              and best[c].notna().any()]
    show += extras[:MAX_RESULT_COLUMNS]
    if names.IMAGE in t and t[names.IMAGE].notna().any():  # trials ran in a container
        show.append(names.IMAGE)
    show += [names.GPU, names.GPUS, "duration_s", names.GPU_UTIL_MEAN, names.GPU_MEM_PEAK_MB]
    if "lineage_attempts" in best and (best["lineage_attempts"] > 1).any():  # continued
        show += [names.CONTINUES, "lineage_attempts", "lineage_device_s"]
    shown_best = best[show].dropna(axis=1, how="all") if not best.empty else best
    if names.IMAGE in shown_best:
        shown_best = shown_best.assign(**{names.IMAGE: shown_best[names.IMAGE].map(short_image)})
    keep = 1 + sum(c.startswith("value") for c in shown_best.columns)  # number and values
    parts = [head, _table(shown_best, title, keep)]
    repeated = t[t[names.STEPS_REPEATED].notna()] if names.STEPS_REPEATED in t else t[:0]
    if not repeated.empty:
        parts.append(Text(
            f"{len(repeated)} continuations did not resume from their checkpoint "
            f"(trials {', '.join(map(str, repeated['number']))}: steps_repeated); have the "
            "script load $SWEEP_CHECKPOINT_DIR or set trainer.resume_args", style="yellow"))
    restored = (t[t[names.RESTORED_PARAMS].notna()] if names.RESTORED_PARAMS in t
                else t[:0])
    if not restored.empty:
        parts.append(Text(
            f"{len(restored)} exploits ran with their donor's params restored from its "
            f"checkpoint, not the perturbed ones (trials "
            f"{', '.join(map(str, restored['number']))}: restored_params); have the script "
            "set the params it is given after it loads the checkpoint", style="yellow"))
    if len(extras) > MAX_RESULT_COLUMNS:
        left = [c.removeprefix(names.METRIC_PREFIX) for c in extras[MAX_RESULT_COLUMNS:]]
        parts.append(Text(f"{len(left)} more result keys in the CSV: {', '.join(left)}",
                          style="dim"))
    return Group(*parts, _table(summary.gpus, "GPUs"))


HEADER_LINES = 3  # a header takes at most this many lines, its words (`a_`, `b`) whole
TEXT_WIDTH = 8  # a text cell folds down to this many characters; a number never folds
WHOLE = (names.IMAGE,)  # columns of text that never folds (an image ID, 12 hex digits)


@dataclass(frozen=True)
class _Fitted:
    """A table of `frame` as wide as the terminal allows: a number keeps its line (`1.785`,
    never `1.78` / `5`); a header folds between its words (`gpu_mem_` / `peak_mb`, at most
    HEADER_LINES lines), never inside one; text folds. Where even that is too wide, the
    rightmost columns but the first `keep` are left out, and a line under the table names
    them."""

    frame: pd.DataFrame
    title: str
    keep: int = 1

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich.text import Text

        headers = [str(c).removeprefix("params_") for c in self.frame.columns]
        cells = [[_cell(v) for v in row] for row in self.frame.itertuples(index=False)]
        least, natural = [], []
        for i, head in enumerate(headers):
            column = [row[i] for row in cells]
            number = max((len(c) for c in column if _is_number(c)), default=0)
            text = max((len(c) for c in column if not _is_number(c)), default=0)
            natural.append(max(len(head), number, text, 1))
            folds = min(text, TEXT_WIDTH) if head not in WHOLE else text
            least.append(max(number, folds, _header_width(head), 1))
        shown = len(headers)
        while shown > self.keep and sum(least[:shown]) + 3 * shown + 1 > options.max_width:
            shown -= 1
        widths = _grow(least[:shown], natural[:shown], options.max_width - 3 * shown - 1)
        yield _rich_table(headers[:shown], [row[:shown] for row in cells], widths, self.title)
        if shown < len(headers):
            yield Text(f"{len(headers) - shown} more columns in a wider terminal and in the "
                       "CSV: " + ", ".join(headers[shown:]), style="dim")


def _words(head: str) -> list[str]:
    """A header's words, each with the `_` that ends it: `gpu_mem_peak_mb` -> `gpu_`,
    `mem_`, `peak_`, `mb`."""
    return re.findall(r"[^_]*_+|[^_]+", head) or [head]


def _header_lines(head: str, width: int) -> list[str]:
    """`head` in lines of at most `width` characters, broken between its words only (a
    word wider than `width` has a line of its own)."""
    lines: list[str] = []
    for word in _words(head):
        if lines and len(lines[-1]) + len(word) <= width:
            lines[-1] += word
        else:
            lines.append(word)
    return lines


def _header_width(head: str) -> int:
    """The narrowest width at which `head` takes at most HEADER_LINES lines, its words
    whole."""
    width = max(len(w) for w in _words(head))
    while len(_header_lines(head, width)) > HEADER_LINES:
        width += 1
    return width


def _grow(least: list[int], natural: list[int], room: int) -> list[int]:
    """Widths from `least` towards `natural`, one character to each column in turn, until
    `room` is used up."""
    widths = list(least)
    room -= sum(widths)
    while room > 0 and any(w < n for w, n in zip(widths, natural, strict=True)):
        for i, n in enumerate(natural):
            if room > 0 and widths[i] < n:
                widths[i] += 1
                room -= 1
    return widths


def _table(frame: pd.DataFrame, title: str, keep: int = 1) -> Any:
    return _Fitted(frame, title, keep)


def _rich_table(headers: list[str], cells: list[list[str]], widths: list[int],
                title: str) -> Any:
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left")
    for head, width in zip(headers, widths, strict=True):
        table.add_column(Text("\n".join(_header_lines(head, width)), no_wrap=True),
                         justify="right", overflow="fold", width=width)
    for row in cells:
        table.add_row(*(Text(c, no_wrap=_is_number(c)) for c in row))  # never markup
    return table


def short_image(image: Any) -> Any:
    """An image ID as `podman images` and `docker images` show it: its first 12 hex digits
    (`sha256:9f0c...` -> `9f0c...`, 12 of them); anything else as it is."""
    if isinstance(image, str) and image.startswith("sha256:"):
        return image.removeprefix("sha256:")[:12]
    return image


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
