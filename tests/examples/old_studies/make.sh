#!/usr/bin/env bash
# Make a stored old study again: tests/examples/old_studies/make.sh COMMIT CHECKOUT
#   COMMIT:   the short commit the study is made by (the folder it goes to)
#   CHECKOUT: a checkout of sweep at that commit (used as PYTHONPATH; it is not changed)
# Run from anywhere, with a Python that has sweep's dependencies (the project's venv). It runs
# study.yaml twice with that old sweep, under SWEEP_FAKE_GPUS=2:
#   1. until both `long` trials (4 and 5) have run 5 steps, then SIGTERM to the driver: trials
#      0-3 are COMPLETE, FAIL, PRUNED, COMPLETE; 4 and 5 are told FAIL "interrupted" (and, where
#      that sweep queues continuations, theirs wait);
#   2. with --gpus 0, until the trial it starts (a continuation of 4, or trial 6 where there
#      are none, a new one) has run 4 steps, then kill -9 of the driver: that trial is left RUNNING.
# What is kept in COMMIT/: study.yaml, trainer.py, old.db and the output folder old/ as that
# sweep left it (trial folders, checkpoint folders, GPU samples: tens of KB).
set -euo pipefail
commit=$1
checkout=$(cd "$2" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
[ "$(git -C "$checkout" rev-parse --short=7 HEAD)" = "$commit" ] || {
    echo "make.sh: $checkout is not at $commit" >&2; exit 2; }
work=$(mktemp -d)
trap 'cat "$work"/run*.log 2>/dev/null; rm -rf "$work"' EXIT
cp "$here/study.yaml" "$here/trainer.py" "$work/"
export PYTHONPATH=$checkout SWEEP_FAKE_GPUS=2 SWEEP_LOCK_DIR=$work/locks

# snapshot: the step each state.json under old/ has reached, into snapshot.json
snapshot() {
    python - "$work/old" > "$work/snapshot.json" <<'PY'
import json, sys
from pathlib import Path
root = Path(sys.argv[1])
print(json.dumps({str(f): json.loads(f.read_text())["next"] for f in root.glob("**/state.json")}))
PY
}

# wait_steps N K: until N state.json files under old/ are K steps past the snapshot (90 s at most)
wait_steps() {
    python - "$work/old" "$work/snapshot.json" "$1" "$2" <<'PY'
import json, sys, time
from pathlib import Path
root, before = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
n, k = int(sys.argv[3]), int(sys.argv[4])
for _ in range(900):
    done = 0
    for f in root.glob("**/state.json"):
        try:
            done += json.loads(f.read_text())["next"] >= before.get(str(f), 0) + k
        except (ValueError, OSError):
            pass
    if done >= n:
        sys.exit(0)
    time.sleep(0.1)
sys.exit(f"make.sh: no {n} trials {k} steps on under {root}")
PY
}

cd "$work"
snapshot
python -m sweep run study.yaml > run1.log 2>&1 &
driver=$!
wait_steps 2 5      # the two long trials (a complete trial takes 2 steps, a pruned one 1)
kill -TERM "$driver"
wait "$driver" || true
snapshot
python -m sweep run study.yaml --gpus 0 > run2.log 2>&1 &
driver=$!
wait_steps 1 4      # the continuation of 4, or trial 6 where there are none
kill -KILL "$driver"
wait "$driver" || true
sleep 3             # the old driver's guards stop its trainer

# fold SQLite's write-ahead log into old.db (a dead driver leaves it unmerged)
python -c 'import sqlite3, sys; sqlite3.connect(sys.argv[1]).execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()' old.db
rm -f old.db-wal old.db-shm
dest=$here/$commit
rm -rf "$dest"
mkdir -p "$dest"
cp -r study.yaml trainer.py old.db old "$dest/"
rm -rf "$dest/old/locks"
du -sh "$dest"
echo "made $dest"
