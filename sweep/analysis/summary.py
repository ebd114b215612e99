"""A study in storage + its GPU samples -> pandas DataFrames, a CSV and a terminal table.

    from sweep.analysis.summary import load
    s = load("studies/quickstart.yaml")   # works while the sweep is still running
    s.trials, s.gpus, s.samples           # DataFrames

Only reads: storage through Optuna, the drivers' `<output_dir>/drivers/*/gpu_samples.csv`.
Writing the CSV is `save`. The trials' frame is `_trials_table`'s, the devices' `_device_use`'s,
the terminal's table `_fitted_table`'s; their public names are this module's too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from sweep._core import UsageError, names, userfiles
from sweep.analysis._device_use import ends, gpu_table, last_seen, read_samples
from sweep.analysis._fitted_table import table
from sweep.analysis._trials_table import seconds, trials_frame
from sweep.spec import Spec, StorageKind, config
from sweep.study import storage

__all__ = ["Summary", "best_rows", "ends", "gpu_table", "last_seen", "load", "load_study",
           "own_files", "read_samples", "render", "seconds", "short_image", "trials_frame"]

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
    return table(pruned[cols].head(top),
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
            shown.append(table(last[["number", names.GPU, "duration_s", names.FAIL_REASON]],
                                f"{'the' if shown else 'no COMPLETE trial yet; the'} last "
                                f"{len(last)} failures"))
        return Group(head, *shown, table(summary.gpus, "GPUs"))
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
    parts = [head, table(shown_best, title, keep)]
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
    return Group(*parts, table(summary.gpus, "GPUs"))


def short_image(image: Any) -> Any:
    """An image ID as `podman images` and `docker images` show it: its first 12 hex digits
    (`sha256:9f0c...` -> `9f0c...`, 12 of them); anything else as it is."""
    if isinstance(image, str) and image.startswith("sha256:"):
        return image.removeprefix("sha256:")[:12]
    return image
