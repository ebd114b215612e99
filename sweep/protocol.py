"""The trainer's side of the trial contract: the files between a trainer and the driver.

Importable without torch, optuna or the rest of sweep:
    from sweep.protocol import params, report, should_stop, write_result

    write_result({"val_loss": 0.31, "acc": 0.9})   # atomically to $SWEEP_RESULT_FILE
    report(step=epoch, value=val_loss)              # one JSON line to $SWEEP_REPORT_FILE
    if should_stop(): ...                           # SIGTERM arrived (pruned, timeout, Ctrl-C)

The driver reads those files with `sweep.trial._results` (and a trainer's output with
`sweep._core.patterns`).
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

RESULT_ENV = "SWEEP_RESULT_FILE"
REPORT_ENV = "SWEEP_REPORT_FILE"
PARAMS_ENV = "SWEEP_PARAMS_FILE"
TRIAL_DIR_ENV = "SWEEP_TRIAL_DIR"
PORT_ENV = "SWEEP_MAIN_PORT"  # a free port for a multi-GPU trial's rendezvous
TRIAL_NUMBER_ENV = "SWEEP_TRIAL_NUMBER"
CHECKPOINT_ENV = "SWEEP_CHECKPOINT_DIR"  # the lineage's folder: the same for every attempt
RUN_ID_ENV = "SWEEP_RUN_ID"  # the lineage's run id
# what sweep sets for each trial, which `trainer.env` may not set (the driver's own
# SWEEP_* variables, such as SWEEP_FAKE_GPUS, are not passed on as these are)
PER_TRIAL = (RESULT_ENV, REPORT_ENV, PARAMS_ENV, TRIAL_DIR_ENV, PORT_ENV, TRIAL_NUMBER_ENV,
             CHECKPOINT_ENV, RUN_ID_ENV, "CUDA_VISIBLE_DEVICES")


# ---- trainer side -------------------------------------------------------------------------


def write_result(metrics: Mapping[str, Any], path: str | os.PathLike[str] | None = None) -> None:
    """Write `metrics` as a JSON object to `path` (default `$SWEEP_RESULT_FILE`) atomically.

    A reader sees either no file or the whole object, never a partial write. The file is
    private (0600, as every trial file).
    Outside a sweep (no path, no env var) it does nothing, so a trainer also runs by hand.
    """
    target = path if path is not None else os.environ.get(RESULT_ENV)
    if not target:
        return
    target = Path(target)
    fd, tmp = tempfile.mkstemp(prefix=".result-", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(dict(metrics), f, allow_nan=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def report(step: int, value: float, path: str | os.PathLike[str] | None = None) -> None:
    """Append `{"step": step, "value": value}` as one flushed line to `$SWEEP_REPORT_FILE`,
    created private (0600, as every trial file), never through a symbolic link.

    The driver passes it to the pruner. Outside a sweep it does nothing.
    """
    target = path if path is not None else os.environ.get(REPORT_ENV)
    if not target:
        return
    line = json.dumps({"step": int(step), "value": float(value)}) + "\n"
    fd = os.open(target, REPORT_FLAGS, 0o600)
    with os.fdopen(fd, "a") as f:
        f.write(line)
        f.flush()


REPORT_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


def params() -> dict[str, Any]:
    """The trial's params as typed JSON values (from `$SWEEP_PARAMS_FILE`); {} outside a sweep."""
    path = os.environ.get(PARAMS_ENV)
    return json.loads(Path(path).read_text()) if path else {}


_stop_requested = False


def _on_sigterm(signum: int, frame: Any) -> None:
    global _stop_requested
    _stop_requested = True


def should_stop() -> bool:
    """True once the driver asked this trial to stop (SIGTERM: pruned, timeout or interrupt).

    The first call installs a SIGTERM handler, so call it once early (e.g. before training).
    After it, SIGTERM no longer kills the process: save a checkpoint and exit within the
    grace period (`trainer.stop_grace`), or the driver sends SIGKILL.
    """
    if signal.getsignal(signal.SIGTERM) is not _on_sigterm:
        signal.signal(signal.SIGTERM, _on_sigterm)
    return _stop_requested


# ---- driver side --------------------------------------------------------------------------


"""A number as Python prints it (`3`, `-0.25`, `1.2e-05`, `nan`, `inf`), for a named group:
`loss: (?P<loss>` + NUMBER + `)`. `nan`/`inf` match so that a diverged value is seen."""


