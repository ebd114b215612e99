#!/usr/bin/env bash
# One run on a machine with a real NVIDIA GPU: real NVML, real pinning, real utilisation.
#   - `sweep gpus` lists the GPUs NVML sees, and honours CUDA_VISIBLE_DEVICES;
#   - a 3-trial sweep of benchmarks/gpu_burn.py through `accelerate launch`;
#   - every trial COMPLETE on its pinned device with CUDA available, per-trial utilisation,
#     memory and energy measured, samples in gpu_samples.csv with real figures;
#   - trials that leave a detached child holding GPU memory (benchmarks/gpu_leftover.py): both
#     COMPLETE, the children gone, nothing left on the GPU, the device not taken out of the pool;
#   - packing: 8 short trials with trials_per_gpu 1, 4 and gpu_memory_gb: auto, trials/hour each
#     ("PACK" lines), auto running its first trial alone and packing the rest;
#   - launchers: 8 short trials through accelerate (a new `accelerate launch` per trial), direct,
#     warm and python ("LAUNCHER" lines;
#     under warm each fork must still initialise CUDA itself and see one device);
#   - a hang (benchmarks/gpu_hang.py: 1 GiB on the GPU, then a sleep): FAIL `hung: ...` with
#     the GPU's utilisation known, its stack (py-spy) naming the function it waits in, nothing
#     left on the GPU;
#   - asha on one card (benchmarks/gpu_asha.yaml: 9 learning rates of a small real model,
#     benchmarks/gpu_asha_trainer.py, 3 trials packed): pauses and promotions, every promoted
#     lineage continued from its checkpoint (no step repeated), the best trained to max_steps,
#     trials packed, nothing left RUNNING or on the GPU; the cost of a pause ("PAUSE" line: the
#     trainer's timed torch.save on SIGTERM and torch.load at start), wall time and steps
#     trained against every configuration to max_steps ("ASHA" line);
#   - containers (trainer.container, podman + the toolkit's CDI spec; SKIP without them): each
#     trial in the image sees exactly its leased device, by UUID, as cuda:0; the image ID is in
#     env.json; no container left.
# Prints PASS/FAIL lines and exits non-zero on any FAIL; copies the evidence to $OUT if set.
# `bash benchmarks/gpu_smoke.sh asha` runs the asha case alone; with SWEEP_FAKE_GPUS=1 it runs
# it on the CPU (a simulated card), its NVML checks skipped.
#
# The device image has torch, accelerate, pandas, psutil, rich, nvidia-ml-py but not optuna and
# its needs. Carry them as wheels (see the device tool's README), here in the repo root:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 -d .whl optuna==5.0.0 alembic sqlalchemy==2.1.9 colorlog \
#     mako pydantic pydantic-core annotated-types typing-inspection typing-extensions cmaes \
#     py-spy
# then run with carry [".whl"]:  bash benchmarks/gpu_smoke.sh
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site PATH="/tmp/site/bin:$PATH"  # py-spy's program too
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" PYTHONUNBUFFERED=1
fake=${SWEEP_FAKE_GPUS:-}  # kept only for the asha case alone (a check of it without a GPU)
unset SWEEP_FAKE_GPUS
work=$(mktemp -d)
cp benchmarks/gpu_smoke.yaml benchmarks/gpu_burn.py "$work/"
fail=0
check() { if eval "$2"; then echo "PASS $1"; else echo "FAIL $1"; fail=1; fi; }
finish() {
  if [ -n "${OUT:-}" ]; then
    cp "$work"/*.txt "$work"/*.log "$work"/pack_*.yaml "$work"/launch_*.yaml "$work"/gpu_smoke/drivers/*/gpu_samples.csv "$work/gpu_smoke/summary.csv" "$OUT/" 2>/dev/null
  fi
  [ "$fail" = 0 ] && echo "GPU SMOKE: PASS" || echo "GPU SMOKE: FAIL"
  exit $fail
}

# ASHA on one card (issue 31): 9 learning rates of a small real model, rungs at steps 30 and 90
# of 270, 3 trials packed on the first GPU. Checks pauses and promotions, each continuation's
# first step right after its lineage's last (its state loaded: nothing repeated), the best
# trained to max_steps, packing, nothing left; prints the cost of a pause from the trainer's
# timing lines (torch.save on SIGTERM, torch.load at start), and the steps trained against
# every configuration to max_steps. About a minute on a GPU.
asha_case() {
  local start end rc simulated=0
  [ -n "${SWEEP_FAKE_GPUS:-}" ] && simulated=1
  cp benchmarks/gpu_asha.yaml benchmarks/gpu_asha_trainer.py "$work/"
  start=$(date +%s.%N)
  CUDA_VISIBLE_DEVICES=0 timeout 240 python3 -m sweep run "$work/gpu_asha.yaml" > "$work/asha.log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  check "ASHA: the run exits 0 ($rc; see asha.log)" "[ $rc = 0 ]"
  sleep 1
  check "ASHA: no trainer left" "! pgrep -f gpu_asha_trainer > /dev/null"
  if [ $simulated = 1 ]; then
    echo "SKIP ASHA: nothing left on the GPU (simulated card)"
  else
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tee "$work/asha_apps.txt"
    check "ASHA: nothing left on the GPU" "[ ! -s $work/asha_apps.txt ]"
  fi
  python3 - "$work" "$start" "$end" "$simulated" <<'PY' || fail=1
import csv
import json
import statistics
import sys
from pathlib import Path
import optuna
import yaml
work, start, end = Path(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
simulated = sys.argv[4] == "1"
spec = yaml.safe_load((work / "gpu_asha.yaml").read_text())
n, top, per_gpu = (spec["study"]["n_trials"], spec["study"]["scheduler"]["max_steps"],
                   spec["gpus"]["trials_per_gpu"])
optuna.logging.set_verbosity(optuna.logging.WARNING)
trials = optuna.load_study(study_name="gpu_asha", storage=f"sqlite:///{work}/gpu_asha.db").trials
by_number = {t.number: t for t in trials}
def lines(number, name):
    path = work / "gpu_asha" / "trials" / str(number) / name
    return [json.loads(s) for s in path.read_text().splitlines()] if path.exists() else []
steps = {t.number: [r["step"] for r in lines(t.number, "reports.jsonl")] for t in trials}
timing = {t.number: lines(t.number, "timing.jsonl") for t in trials}
events = [e for ts in timing.values() for e in ts]
ok = True
def check(name, cond):
    global ok
    print(("PASS " if cond else "FAIL ") + name)
    ok &= bool(cond)
states = [t.state.name for t in trials]
check(f"ASHA: nothing left RUNNING or queued ({len(trials)} attempts: "
      f"{', '.join(f'{states.count(s)} {s}' for s in sorted(set(states)))})",
      set(states) <= {"COMPLETE", "PRUNED"})
paused = [t for t in trials if "paused_at" in t.user_attrs]
resumed = [t for t in trials if "retry_of" in t.user_attrs]
before = {t.number: by_number[int(t.user_attrs.get("continues", t.user_attrs["retry_of"]))]
          for t in resumed}  # the attempt each continues
check(f"ASHA: {len(paused)} pauses, {len(resumed)} promotions (each continues a paused attempt)",
      paused and resumed and all("paused_at" in b.user_attrs for b in before.values()))
check("ASHA: no trial has steps_repeated",
      not [t.number for t in trials if "steps_repeated" in t.user_attrs])
saves = [e for e in events if e["event"] == "save" and e["stop"]]
check(f"ASHA: every paused trial saved its state when stopped ({len(saves)} of {len(paused)})",
      sorted(e["step"] for e in saves) == sorted(max(steps[t.number]) for t in paused))
for t in resumed:
    prev = before[t.number]
    loaded = [e["step"] for e in timing[t.number] if e["event"] == "load"]
    first, last = min(steps[t.number], default=None), max(steps[prev.number], default=None)
    check(f"ASHA: trial {t.number} continues trial {prev.number} (paused at step "
          f"{prev.user_attrs.get('paused_at')}, saved at {last}) from its checkpoint: "
          f"loaded step {loaded}, first step {first}",
          first is not None and last is not None and loaded == [last] and first == last + 1
          and first > prev.user_attrs.get("paused_at", top))
done = [t for t in trials if t.state.name == "COMPLETE"]
best = min(done, key=lambda t: t.value) if done else None
check(f"ASHA: the best lineage trained to step {top}" + (
      f" (trial {best.number}, lr {best.params['lr']:.3g}, loss {best.value:.4f})" if best else ""),
      best is not None and max(steps[best.number]) == top and max(best.intermediate_values) == top)
edges = sorted([(t.datetime_start, 1) for t in trials]
               + [(t.datetime_complete, -1) for t in trials])
most = now = 0
for _, d in edges:
    now += d
    most = max(most, now)
rows = [r for f in (work / "gpu_asha" / "drivers").glob("*/gpu_samples.csv")
        for r in csv.DictReader(f.open())]
sampled = max((len(r["trials"].split(";")) for r in rows if r["trials"]), default=0)
cards = {t.user_attrs.get("gpu") for t in trials}
check(f"ASHA: trials packed on one card ({cards}): at most {most} at once by their times, "
      f"{sampled} in one GPU sample (trials_per_gpu {per_gpu})",
      len(cards) == 1 and 1 < most <= per_gpu and 1 < sampled <= per_gpu)
starts = [e for e in events if e["event"] == "start"]
if simulated:
    print("SKIP ASHA: every attempt on CUDA (simulated card)")
else:
    peak = max((t.user_attrs.get("gpu_mem_peak_mb") or 0 for t in trials), default=0)
    check(f"ASHA: every attempt trained on CUDA (peak memory of a trial {peak:.0f} MB)",
          len(starts) == len(trials) and all(e["device"] == "cuda" for e in starts))
loads = [e for e in events if e["event"] == "load"]
def med(key, of):
    return statistics.median(e[key] for e in of) if of else float("nan")
print(f"PAUSE cost per trial: save median {med('seconds', saves):.3f} s, load median "
      f"{med('seconds', loads):.3f} s ({len(saves)} pauses, {len(loads)} loads, state "
      f"{med('bytes', saves + loads) / 1e6:.0f} MB); start-up to the first step (interpreter, "
      f"torch, CUDA, data, load) median {med('startup', [e for e in starts if e['step']]):.2f} s "
      f"for a continuation, {med('startup', [e for e in starts if not e['step']]):.2f} s for a "
      "first attempt")
with open(work / "asha_timing.txt", "w") as f:
    f.writelines(json.dumps({"trial": k, **e}) + "\n" for k, ts in timing.items() for e in ts)
total = sum(len(s) for s in steps.values())
busy = sum((t.datetime_complete - t.datetime_start).total_seconds() for t in trials)
print(f"ASHA: wall {end - start:.1f} s, {len(trials)} attempts of {n} configurations, {total} "
      f"steps trained against {n * top} to train each to {top} ({total / (n * top):.0%}); the "
      f"attempts' time on the card {busy:.1f} s")
sys.exit(0 if ok else 1)
PY
}
if [ "${1:-}" = asha ]; then  # this case alone
  [ -n "$fake" ] && export SWEEP_FAKE_GPUS=$fake
  asha_case
  finish
fi

nvidia-smi -L || true
python3 -m sweep gpus | tee "$work/gpus.txt"
n=$(nvidia-smi -L | grep -c '^GPU')
check "sweep gpus lists the $n NVML devices" "[ \$(grep -c NVIDIA $work/gpus.txt) -eq $n ]"
CUDA_VISIBLE_DEVICES= python3 -m sweep gpus > "$work/none.txt" 2>&1
check "CUDA_VISIBLE_DEVICES='' empties the pool" "! grep -q NVIDIA $work/none.txt"

time python3 -m sweep run "$work/gpu_smoke.yaml" 2>&1 | tee "$work/run.log"
python3 -m sweep summary "$work/gpu_smoke.yaml" | tee "$work/summary.txt"
python3 - "$work" <<'PY' || fail=1
import sys
from pathlib import Path
import pandas as pd
from sweep.analysis import summary
work = Path(sys.argv[1])
s = summary.load(work / "gpu_smoke.yaml")
t = s.trials
import optuna
trials = optuna.load_study(study_name="gpu_smoke", storage=s.spec.storage_url).trials
import pynvml
pynvml.nvmlInit()
uuids = {i: pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
         for i in range(pynvml.nvmlDeviceGetCount())}
ok = True
def check(name, cond):
    global ok
    print(("PASS " if cond else "FAIL ") + name)
    ok &= bool(cond)
check("3 trials COMPLETE", list(t["state"]) == ["COMPLETE"] * 3)
for tr in trials:
    a = tr.user_attrs
    check(f"trial {tr.number}: trainer saw CUDA", a.get("metric_cuda") == 1.0)
    visible = (work / "gpu_smoke" / "trials" / str(tr.number) / "visible.txt").read_text()
    check(f"trial {tr.number}: one visible device, the leased one, by UUID ({visible})",
          a.get("metric_device_count") == 1.0 and visible == uuids[int(a.get("gpu"))])
    check(f"trial {tr.number}: utilisation measured ({a.get('gpu_util_mean')})",
          (a.get("gpu_util_mean") or 0) > 30)
    check(f"trial {tr.number}: memory peak measured ({a.get('gpu_mem_peak_mb')})",
          (a.get("gpu_mem_peak_mb") or 0) > 100)
    check(f"trial {tr.number}: energy measured ({a.get('energy_j')})", (a.get("energy_j") or 0) > 0)
    check(f"trial {tr.number}: intermediate values reported", len(tr.intermediate_values) > 0)
check("samples carry real utilisation", s.samples["util_gpu"].notna().all())
check("busy fraction in (0, 1]", ((s.gpus["busy_fraction"] > 0) & (s.gpus["busy_fraction"] <= 1)).all())
print(s.gpus.to_string())
sys.exit(0 if ok else 1)
PY

cp benchmarks/gpu_leftover.yaml benchmarks/gpu_leftover.py "$work/"
time python3 -m sweep run "$work/gpu_leftover.yaml" 2>&1 | tee "$work/leftover.log"
sleep 1
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tee "$work/apps.txt"
check "nothing left on the GPU after the leftover sweep" "[ ! -s $work/apps.txt ]"
check "no GPU taken out of the pool" "! grep -q 'taken out of the pool' $work/leftover.log"
check "no leftover child alive" "! pgrep -f child_holding"
python3 - "$work" <<'PY' || fail=1
import sys
from pathlib import Path
import optuna
work = Path(sys.argv[1])
trials = optuna.load_study(study_name="gpu_leftover",
                           storage=f"sqlite:///{work}/gpu_leftover.db").trials
ok = True
for t in trials:
    cond = t.state.name == "COMPLETE" and t.user_attrs.get("metric_child_ready") == 1.0
    print(("PASS " if cond else "FAIL ") + f"leftover trial {t.number} COMPLETE with its child "
          f"holding the GPU ({t.state.name}, {t.user_attrs})")
    ok &= cond
if len(trials) == 2:
    gap = (trials[1].datetime_start - trials[0].datetime_complete).total_seconds()
    print(f"device handed over {gap:.1f} s after trial 0 was told (its child had 3 s of grace)")
sys.exit(0 if ok else 1)
PY

# timed NAME LABEL [alone-first]: run $work/NAME.yaml (8 trials of gpu_burn.py), print
# "LABEL: trials/hour", check every trial COMPLETE on CUDA; alone-first also checks that the
# first trial ran alone and the rest packed (gpu_memory_gb: auto on one GPU).
timed() {
  local start end
  start=$(date +%s.%N)
  python3 -m sweep run "$work/$1.yaml" > "$work/$1.log" 2>&1
  end=$(date +%s.%N)
  python3 - "$work" "$1" "$2" "$start" "$end" "${3:-}" <<'PY' || fail=1
import sys
from pathlib import Path
import optuna
work, name, label, start, end, extra = sys.argv[1:7]
trials = optuna.load_study(study_name=name, storage=f"sqlite:///{work}/{name}.db").trials
done = [t for t in trials if t.state.name == "COMPLETE"]
edges = sorted([(t.datetime_start, 1) for t in done] + [(t.datetime_complete, -1) for t in done])
most, now = 0, 0
for _, d in edges:
    now += d
    most = max(most, now)
wall = float(end) - float(start)
print(f"{label}: {len(done)}/8 COMPLETE in {wall:.1f} s = {3600 * len(done) / wall:.0f} "
      f"trials/hour, at most {most} at once, peak memory "
      f"{max((t.user_attrs.get('gpu_mem_peak_mb') or 0 for t in done), default=0):.0f} MB")
ok = len(done) == 8 and all(t.user_attrs.get("metric_cuda") == 1.0
                            and t.user_attrs.get("metric_device_count") == 1.0 for t in done)
print(("PASS " if ok else "FAIL ") + f"{label}: every trial COMPLETE on CUDA, seeing one device")
if extra == "alone-first" and ok:
    first = min(done, key=lambda t: t.datetime_start)
    alone = all(t.datetime_start >= first.datetime_complete for t in done if t is not first)
    print(("PASS " if alone and most > 1 else "FAIL ") +
          f"{label}: the first trial ran alone, the rest packed")
    ok = alone and most > 1
sys.exit(0 if ok else 1)
PY
}

# Packing (issue 11): 8 short trials of a small model, trials_per_gpu 1 vs 4 vs
# gpu_memory_gb: auto (the first trial alone, then packed by its measured peak): trials/hour.
for mode in tpg1 tpg4 auto; do
  case $mode in
    tpg1) gpus="gpus: {trials_per_gpu: 1, sample_interval: 0.5}"; extra="" ;;
    tpg4) gpus="gpus: {trials_per_gpu: 4, sample_interval: 0.5}"; extra="" ;;
    auto) gpus="gpus: {sample_interval: 0.5}"; extra="  gpu_memory_gb: auto" ;;
  esac
  cat > "$work/pack_$mode.yaml" <<YAML
study: {name: pack_$mode, direction: minimize, metric: loss, n_trials: 8,
        sampler: {type: random, seed: 0}}
trainer:
  script: gpu_burn.py
  args: ["--seconds", "6"]
  timeout: 300
$extra
$gpus
params:
  size: {type: categorical, choices: [512, 1024]}
YAML
  timed "pack_$mode" "PACK $mode" "$([ $mode = auto ] && echo alone-first)"
done

# Launchers (issue 13): the same 8 short trials of a small real model through each launcher,
# one trial per GPU: trials/hour.
for launcher in accelerate direct warm python; do
  cat > "$work/launch_$launcher.yaml" <<YAML
study: {name: launch_$launcher, direction: minimize, metric: loss, n_trials: 8,
        sampler: {type: random, seed: 0}}
trainer: {script: gpu_burn.py, args: ["--seconds", "4"], launcher: $launcher, timeout: 300}
gpus: {sample_interval: 0.5}
params:
  size: {type: categorical, choices: [512, 1024]}
YAML
  timed "launch_$launcher" "LAUNCHER $launcher"
done

# Hang (issue 23): a trial that holds GPU memory and sleeps is found hung by utilisation
# (hang_after 10 s), its stack dumped with py-spy, then stopped; nothing is left on the GPU.
cp benchmarks/gpu_hang.py "$work/"
cat > "$work/gpu_hang.yaml" <<YAML
study: {name: gpu_hang, direction: minimize, metric: loss, n_trials: 1,
        max_consecutive_failures: 1}
trainer: {script: gpu_hang.py, hang_after: 10, hang_gpu_util: 5, stop_grace: 2}
gpus: {sample_interval: 0.5}
YAML
time python3 -m sweep run "$work/gpu_hang.yaml" 2>&1 | tee "$work/hang.log"
sleep 1
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tee "$work/hang_apps.txt"
check "nothing left on the GPU after the hung trial" "[ ! -s $work/hang_apps.txt ]"
cp "$work/gpu_hang/trials/0/stack.txt" "$work/hang_stack.txt" 2>/dev/null
python3 - "$work" <<'PY' || fail=1
import sys
from pathlib import Path
import optuna
work = Path(sys.argv[1])
t, = optuna.load_study(study_name="gpu_hang", storage=f"sqlite:///{work}/gpu_hang.db").trials
reason = t.user_attrs.get("fail_reason") or ""
ok = t.state.name == "FAIL" and reason.startswith("hung: ") and "GPU use at most" in reason
print(("PASS " if ok else "FAIL ") + f"HANG: FAIL hung, by utilisation ({t.state.name}: {reason})")
stack = (work / "gpu_hang" / "trials" / "0" / "stack.txt").read_text()
named = "hold_memory_and_wait" in stack
print(("PASS " if named else "FAIL ") + "HANG: stack.txt names hold_memory_and_wait")
if not named:
    print(stack)
print(f"HANG: told {(t.datetime_complete - t.datetime_start).total_seconds():.1f} s after it "
      "started (hang_after 10 s + start-up + stop_grace)")
sys.exit(0 if ok and named else 1)
PY

asha_case

# Containers (issue 33): a trial in a container image sees exactly its device. Needs podman and
# the NVIDIA container toolkit (nvidia-ctk) on the machine; SKIP otherwise. No registry: the
# image is a marker file and the root's links, imported with `podman import`; the machine's own
# /usr and its Python's prefix and site folders are mounted read-only (run_args), so the trial
# runs this machine's CUDA torch inside a container that CDI gives one GPU (by UUID).
if command -v podman >/dev/null && command -v nvidia-ctk >/dev/null; then
  export CONTAINERS_CONF="$work/containers.conf"
  nofile=$(ulimit -n); nproc=$(ulimit -u)
  [ "$nofile" = unlimited ] || [ "$nofile" -gt 1024 ] && nofile=1024
  [ "$nproc" = unlimited ] || [ "$nproc" -gt 1024 ] && nproc=1024
  printf '[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=%s:%s"]\n[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\n' \
    "$nofile" "$nofile" "$nproc" "$nproc" > "$CONTAINERS_CONF"
  command -v runc >/dev/null || sed -i '/^runtime = /d' "$CONTAINERS_CONF"
  mkdir -p /etc/cdi && nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml > "$work/cdi.log" 2>&1
  check "CONTAINER: nvidia-ctk generated the CDI spec" "[ -s /etc/cdi/nvidia.yaml ]"
  root="$work/image-root"; mkdir -p "$root/etc" "$root/tmp" "$root/proc" "$root/sys" "$root/dev"
  echo "sweep smoke image" > "$root/etc/sweep-smoke-image"
  cp /etc/ld.so.cache /etc/passwd /etc/group "$root/etc/" 2>/dev/null
  mounts='"-v", "/usr:/usr:ro"'
  for d in bin sbin lib lib32 lib64; do
    if [ -L "/$d" ]; then ln -s "$(readlink "/$d")" "$root/$d"
    elif [ -d "/$d" ]; then mounts="$mounts, \"-v\", \"/$d:/$d:ro\""; fi
  done
  py=$(python3 -c 'import sys; print(sys.executable)')  # a venv's own: its pyvenv.cfg counts
  for d in $(python3 -c 'import site, sys; print(" ".join(sorted({sys.prefix, sys.base_prefix, *site.getsitepackages(), *sys.path[1:]})))'); do
    case "$d" in /usr|/usr/*|"$PWD"|"$PWD"/*) ;; *) [ -d "$d" ] && mounts="$mounts, \"-v\", \"$d:$d:ro\"";; esac
  done
  tar -C "$root" -cf "$work/image.tar" . && podman import -q "$work/image.tar" localhost/sweep-smoke:1 > "$work/import.log" 2>&1
  cp benchmarks/gpu_container_probe.py "$work/"
  cat > "$work/gpu_container.yaml" <<YAML
study: {name: gpu_container, direction: minimize, metric: loss, n_trials: $n,
        sampler: {type: random, seed: 0}}
trainer:
  script: gpu_container_probe.py
  launcher: python
  python: $py
  timeout: 300
  container: {image: "localhost/sweep-smoke:1", engine: podman, shm_size: 1g,
              run_args: [$mounts]}
params:
  x: {type: float, low: 0.0, high: 1.0}
YAML
  time python3 -m sweep run "$work/gpu_container.yaml" 2>&1 | tee "$work/container.log"
  python3 - "$work" <<'PY' || fail=1
import json
import sys
from pathlib import Path
import optuna
import pynvml
work = Path(sys.argv[1])
pynvml.nvmlInit()
uuids = {i: pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
         for i in range(pynvml.nvmlDeviceGetCount())}
trials = optuna.load_study(study_name="gpu_container",
                           storage=f"sqlite:///{work}/gpu_container.db").trials
ok = bool(trials)
for t in trials:
    folder = work / "gpu_container" / "trials" / str(t.number)
    try:
        r = json.loads((folder / "result.json").read_text())
    except (OSError, ValueError):
        r = {}
    leased = uuids.get(int(t.user_attrs.get("gpu", -1)), "?")
    command = (folder / "command.sh").read_text() if (folder / "command.sh").exists() else ""
    cond = (t.state.name == "COMPLETE" and r.get("inside") is True and r.get("cuda") == 1.0
            and r.get("device_count") == 1.0 and r.get("visible") == leased
            and f"--device nvidia.com/gpu={leased}" in command
            and (r.get("uuid") is None or leased.endswith(str(r.get("uuid")))))
    print(("PASS " if cond else "FAIL ") + f"CONTAINER trial {t.number}: in the image, one "
          f"device, the leased one ({leased}): {t.state.name} {r}")
    env = json.loads((folder / "env.json").read_text()) if (folder / "env.json").exists() else {}
    image = (env.get("image") or {}).get("id")
    print(("PASS " if image and t.user_attrs.get("image") == image else "FAIL ")
          + f"CONTAINER trial {t.number}: env.json and the trial's attribute hold the image ID "
          f"({image})")
    ok &= cond and bool(image) and t.user_attrs.get("image") == image
sys.exit(0 if ok else 1)
PY
  podman ps --all --filter "label=sweep.output_dir=$work/gpu_container" --format '{{.Names}}' > "$work/containers_left.txt"
  check "CONTAINER: no container left" "[ ! -s $work/containers_left.txt ]"
  podman rmi -f localhost/sweep-smoke:1 > /dev/null 2>&1
else
  echo "SKIP CONTAINER: needs podman and nvidia-ctk (the NVIDIA container toolkit) on this machine"
fi

finish
