"""Records what a trial's process looks like from inside (for `launcher: warm` against a
fresh interpreter), then behaves as --mode says: ok, exit3, exitneg, raise, interrupt, term,
seeds (numpy's and torch's random state), env (what python took from its environment),
environ (its whole environment and interpreter)."""

import time

FIRST = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--x", type=float, default=0.0)
    p.add_argument("--mode", default="ok")
    p.add_argument("--sleep", type=float, default=0.0)
    args = p.parse_args()
    time.sleep(args.sleep)
    record = {
        "first": FIRST, "pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
        "ppid": os.getppid(), "argv": sys.argv, "name": __name__, "path0": sys.path[0],
        "cwd": os.getcwd(), "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "random": random.random(), "stdin": sys.stdin.read(),
        "torch_loaded_at_start": "torch" in sys.modules,
        "builtins_module": type(__builtins__).__name__, "orig_argv": sys.orig_argv[1:],
    }
    if args.mode == "seeds":
        import numpy
        import torch

        record["numpy"] = float(numpy.random.random())
        record["torch"] = torch.initial_seed()
    if args.mode == "env":
        import decimal
        import faulthandler

        import torch

        record.update(optimize=sys.flags.optimize, encoding=sys.stdout.encoding,
                      faulthandler=faulthandler.is_enabled(), tz=time.tzname[0],
                      local=getattr(decimal, "MINE", None), path1=sys.path[1],
                      threads=torch.get_num_threads())
    if args.mode == "environ":
        record.update(environ=dict(os.environ), executable=sys.executable, flags=str(sys.flags),
                      parent=Path(f"/proc/{os.getppid()}/cmdline").read_text().split("\0"),
                      grandparent=int(Path(f"/proc/{os.getppid()}/stat").read_text()
                                      .rpartition(")")[2].split()[1]))
    print(f"stdout of trial {os.environ['SWEEP_TRIAL_NUMBER']}")
    print(f"stderr of trial {os.environ['SWEEP_TRIAL_NUMBER']}", file=sys.stderr)
    Path(os.environ["SWEEP_TRIAL_DIR"], "probe.json").write_text(json.dumps(record))
    Path(os.environ["SWEEP_RESULT_FILE"]).write_text(json.dumps({"score": args.x}))
    if args.mode == "exit3":
        return 3
    if args.mode == "exitneg":
        sys.exit(-9)
    if args.mode == "raise":
        raise RuntimeError("the trainer broke")
    if args.mode == "interrupt":
        raise KeyboardInterrupt
    if args.mode == "term":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
