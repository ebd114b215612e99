"""A trainer that logs `epoch N loss X` on stderr, then fails (exit 3) or ends 0 (`--ok` or
`--ok true`) without a result: what `accelerate launch` 1.16 repeats after it ended."""

import sys
import time

ok = sys.argv[1:] in (["--ok"], ["--ok", "true"])
for epoch in range(1, 4):
    print(f"epoch {epoch} loss {1.0 / epoch:.4f}", file=sys.stderr, flush=True)
    time.sleep(0.05)
print("giving up" if not ok else "done", file=sys.stderr, flush=True)
sys.exit(0 if ok else 3)
