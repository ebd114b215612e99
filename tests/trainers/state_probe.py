"""Records the Accelerate state a trial gets (device, mixed precision, processes), the
variables `accelerate launch` sets and the arguments it was given, so `launcher: direct` can
be compared with it. Its result comes late: a child in a session of its own writes
{"score": 1} 0.3 s after the trainer ended (at once, without the interpreter's teardown);
with `--now true` the trainer also writes {"score": 2} itself before it ends (tests of when
a result counts). Under `launcher: python` (no ACCELERATE_* variables) it records nothing
and imports neither torch nor accelerate."""

import json
import os
import subprocess
import sys
from pathlib import Path


def record_state(trial_dir: Path) -> None:
    import torch
    from accelerate import Accelerator
    from accelerate.state import PartialState

    acc = Accelerator()
    state = PartialState()
    record = {
        "device": str(acc.device), "mixed_precision": acc.mixed_precision,
        "num_processes": acc.num_processes, "distributed_type": str(acc.distributed_type),
        "state_device": str(state.device), "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "torch_threads": torch.get_num_threads(), "argv": sys.argv[1:],
        "env": {k: v for k, v in sorted(os.environ.items())
                if k.startswith(("ACCELERATE_", "OMP_", "KMP_", "MASTER_"))},
    }
    (trial_dir / "state.json").write_text(json.dumps(record, indent=1))
    ancestors, pid = [], os.getpid()  # how the trial was started: its parents' command lines
    for _ in range(3):
        pid = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
        ancestors.append(Path(f"/proc/{pid}/cmdline").read_text().split("\0"))
    (trial_dir / "ancestors.json").write_text(json.dumps(ancestors))


def main() -> None:
    if any(key.startswith("ACCELERATE_") for key in os.environ):
        record_state(Path(os.environ["SWEEP_TRIAL_DIR"]))
    result = os.environ["SWEEP_RESULT_FILE"]
    write = ("import json, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
             f"time.sleep(0.3); json.dump({{'score': 1}}, open({result!r}, 'w'))")
    subprocess.Popen([sys.executable, "-c", write], start_new_session=True)
    if sys.argv[1:] == ["--now", "true"]:
        Path(result).write_text(json.dumps({"score": 2}))
    os._exit(0)  # ended now: torch's teardown would outlast the child's 0.3 s


if __name__ == "__main__":
    main()
