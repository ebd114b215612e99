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
#   - containers (trainer.container, podman + the toolkit's CDI spec; SKIP without them): each
#     trial in the image sees exactly its leased device, by UUID, as cuda:0; the image ID is in
#     env.json; no container left.
# Prints PASS/FAIL lines and exits non-zero on any FAIL; copies the evidence to $OUT if set.
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
unset SWEEP_FAKE_GPUS
work=$(mktemp -d)
cp benchmarks/gpu_smoke.yaml benchmarks/gpu_burn.py "$work/"
fail=0
check() { if eval "$2"; then echo "PASS $1"; else echo "FAIL $1"; fail=1; fi; }

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

if [ -n "${OUT:-}" ]; then
  cp "$work"/*.txt "$work"/*.log "$work"/pack_*.yaml "$work"/launch_*.yaml "$work"/gpu_smoke/drivers/*/gpu_samples.csv "$work/gpu_smoke/summary.csv" "$OUT/" 2>/dev/null
fi
[ "$fail" = 0 ] && echo "GPU SMOKE: PASS" || echo "GPU SMOKE: FAIL"
exit $fail
