"""A trainer that misbehaves as `--case` says when its x is 0.1, and behaves (writes a good
result) otherwise: at x 0.5 after 1.5 s, the neighbour that runs beside the misbehaving trial
and must not be harmed; at any other x (a trial that only completes the budget) at once."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--x", type=float, default=0.5)
    p.add_argument("--case", default="")
    args, _ = p.parse_known_args()
    result = Path(os.environ["SWEEP_RESULT_FILE"])
    reports = Path(os.environ["SWEEP_REPORT_FILE"])
    if args.case == "flood_slow":  # every trial: report lines for 3 s, as fast as it can
        t0, step = time.time(), 0
        with open(reports, "a") as f:
            while time.time() - t0 < 3:
                for _ in range(100):
                    f.write(json.dumps({"step": step, "value": 1.0}) + "\n")
                    step += 1
                f.flush()
                time.sleep(0.01)
        result.write_text(json.dumps({"score": args.x}))
        return 0
    if args.case == "flood_stdout":  # every trial: report lines on stdout until it is stopped
        print("flooding", file=sys.stderr, flush=True)
        step = 0
        while True:
            sys.stdout.write("".join(f"step {s} loss 0.5\n" for s in range(step, step + 1000)))
            step += 1000
    if args.x != 0.1:
        time.sleep(1.5 if args.x == 0.5 else 0.0)
        result.write_text(json.dumps({"score": args.x}))
        return 0
    case = args.case
    lines = {
        "step_negative": '{"step": -1, "value": 0.9}',
        "step_huge": '{"step": 99999999999999999999, "value": 0.9}',
        "value_huge": '{"step": 1, "value": ' + "9" * 400 + "}",
    }
    if case in lines:
        reports.write_text(lines[case] + "\n")
        time.sleep(30)  # the driver stops it
    elif case == "metric_huge":
        result.write_text('{"score": ' + "9" * 400 + "}")
    elif case == "metric_5000_digits":
        result.write_text('{"score": ' + "9" * 5000 + "}")
    elif case in ("brackets", "markup"):
        line = "error reading [/data/train]" if case == "brackets" else "[red]x[/red] failed"
        print(line, file=sys.stderr)
        return 1
    elif case == "result_fifo":
        os.mkfifo(result)
    elif case == "result_dir":
        result.mkdir()
    elif case == "result_link":  # a good result, elsewhere: a link is not followed
        (result.parent / "elsewhere.json").write_text(json.dumps({"score": 0.123}))
        result.symlink_to(result.parent / "elsewhere.json")
    elif case == "report_link":  # a file the trainer does not own the content of
        reports.symlink_to("/etc/passwd")
        time.sleep(30)
    elif case == "report_dir":
        reports.mkdir()
        time.sleep(30)
    elif case == "result_nested":
        result.write_text('{"score": 0.5, "d": ' + "[" * 100_000 + "]" * 100_000 + "}")
    elif case == "report_nested":
        reports.write_text('{"step": 0, "value": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
        time.sleep(30)
    elif case == "huge_other_key":
        result.write_text('{"score": 1.0, "b": ' + "9" * 5000 + "}")
    elif case == "progress_bar":
        for i in range(200_000):
            sys.stdout.write(f"\r 50%|#####| {i}/200000 [00:01<00:01, 1000.00it/s]")
        print("\nfinal val_loss: 0.25")
    elif case == "percent":
        print("acc: 97.5%")
    elif case in ("kill_own_group", "kill_guard"):
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                         start_new_session=True)
        result.write_text(json.dumps({"score": 1.0}))
        if case == "kill_own_group":
            os.killpg(0, signal.SIGKILL)
        os.kill(os.getppid(), signal.SIGKILL)  # with `launcher: python`, the guard
        time.sleep(120)
    elif case == "report_fifo":
        os.mkfifo(reports)
        time.sleep(30)
    elif case == "own_attributes":
        result.write_text(json.dumps({"score": 1.0, "gpu": 99, "exit_code": 99, "attempt": 99,
                                      "retry_of": 99, "owner": 99, "fail_reason": 99}))
    elif case == "flood":
        with open(reports, "a") as f:
            for step in range(20_000):
                f.write(json.dumps({"step": step, "value": 1.0 / (step + 1)}) + "\n")
        result.write_text(json.dumps({"score": 0.0}))
    else:
        raise SystemExit(f"unknown case {case}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
