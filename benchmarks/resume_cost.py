"""Device-seconds lost per interruption: the driver SIGTERMed while its trials run, then run
again to the end, against the same study run once without interruption.

The trainer checkpoints every step where a user of each checkout would: in
`$SWEEP_CHECKPOINT_DIR` where sweep gives one, else in `$SWEEP_TRIAL_DIR` (what the docs said
before lineages), and resumes from what it finds there. Each round runs the study three ways
side by side, for this checkout and for `--repo` (e.g. /work/main, the behaviour before):
uninterrupted; interrupted once (SIGTERM once every trial has made `--cut` steps) then rerun.
Device-seconds are the trials' durations from storage (one device each); lost per
interruption = (interrupted + rerun - uninterrupted) / the trials the signal hit.

    python benchmarks/resume_cost.py [--repo /work/main] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import yaml

HERE = Path(__file__).resolve().parent.parent
TRAINER = Path(__file__).resolve().parent / "resume_trainer.py"
GPUS, STEPS, STEP_S = 2, 40, 0.1


def study_file(tmp: Path, n_trials: int) -> Path:
    path = tmp / "study.yaml"
    path.write_text(yaml.safe_dump({
        "study": {"name": "resume", "direction": "minimize", "metric": "score",
                  "n_trials": n_trials, "sampler": {"type": "random", "seed": 0}},
        "trainer": {"script": str(TRAINER), "launcher": "python", "grace_period": 5.0,
                    "args": ["--steps", str(STEPS), "--sleep", str(STEP_S)]},
        "params": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
    }))
    return path


def run(repo: Path, study: Path, cut: int | None) -> None:
    env = {**os.environ, "PYTHONPATH": str(repo), "SWEEP_FAKE_GPUS": str(GPUS),
           "SWEEP_LOCK_DIR": str(study.parent / "locks")}
    driver = subprocess.Popen([sys.executable, "-m", "sweep", "run", str(study)], env=env,
                              cwd=study.parent,  # not this checkout ahead of PYTHONPATH
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if cut is not None:
        def steps_each() -> list[int]:
            return [len(p.read_text().splitlines())
                    for p in study.parent.glob("resume/**/steps.log")]
        while len(steps_each()) < GPUS or min(steps_each()) < cut:
            time.sleep(0.02)
        driver.send_signal(signal.SIGTERM)
    _, err = driver.communicate(timeout=300)
    if driver.returncode not in (0, 130):
        raise RuntimeError(err)


def device_seconds(study: Path) -> tuple[float, int, int]:
    """(device-seconds of all trials, trials told interrupted, finished trials)."""
    trials = optuna.load_study(study_name="resume",
                               storage=f"sqlite:///{study.parent / 'resume.db'}").trials
    total = sum((t.datetime_complete - t.datetime_start).total_seconds()
                for t in trials if t.datetime_complete and t.datetime_start)
    cut = sum(t.user_attrs.get("fail_reason") == "interrupted" for t in trials)
    done = sum(t.state.name == "COMPLETE" for t in trials)
    return total, cut, done


def steps_run(study: Path) -> int:
    return sum(len(p.read_text().splitlines())
               for p in study.parent.glob("resume/**/steps.log"))


def one_round(repo: Path, n_trials: int, cut: int) -> tuple[float, float, float]:
    """(device-seconds uninterrupted, device-seconds lost per interruption, training steps
    run again or thrown away per interruption)."""
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        plain = study_file(Path(a), n_trials)
        run(repo, plain, None)
        base, _, done = device_seconds(plain)
        assert done == n_trials
        broken = study_file(Path(b), n_trials)
        run(repo, broken, cut)
        run(repo, broken, None)
        total, hit, done = device_seconds(broken)
        assert done == n_trials and hit
        extra = steps_run(broken) - steps_run(plain)
        print(f"  {repo}: {base:.1f} vs {total:.1f} device-s, {hit} interrupted, "
              f"{extra} steps more", flush=True)
        return base, (total - base) / hit, extra / hit


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repo", type=Path, default=None, help="another checkout, side by side")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--n-trials", type=int, default=4)
    p.add_argument("--cut", type=int, default=30, help="steps of each trial before SIGTERM")
    args = p.parse_args()
    repos = {"this": HERE, **({"repo": args.repo.resolve()} if args.repo else {})}
    got: dict[str, list[tuple[float, float, float]]] = {k: [] for k in repos}
    for _ in range(args.rounds):
        for name, repo in repos.items():
            got[name].append(one_round(repo, args.n_trials, args.cut))
    print(f"{args.n_trials} trials of {STEPS} steps x {STEP_S} s on {GPUS} simulated GPUs, "
          f"SIGTERM after {args.cut} steps of each running trial; {args.rounds} rounds, medians")
    for name, rounds in got.items():
        base = statistics.median(r[0] for r in rounds)
        lost = statistics.median(r[1] for r in rounds)
        steps = statistics.median(r[2] for r in rounds)
        print(f"{name:5} {repos[name]}: uninterrupted {base:.1f} device-s; lost per "
              f"interruption {lost:.2f} device-s (rounds: "
              f"{', '.join(f'{r[1]:.2f}' for r in rounds)}), {steps:.1f} training steps "
              f"({steps * STEP_S:.1f} s of training)")


if __name__ == "__main__":
    main()
