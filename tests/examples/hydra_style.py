"""A Hydra-style app, as `@hydra.main` runs one (hydra-core itself is not needed here).

Not written for sweep: it takes `key=value` overrides, makes its run folder
`outputs/<date>/<time>/` relative to the folder it runs in (as Hydra does by default), writes
`.hydra/overrides.yaml` and its log there, reads the data file `data.path` names, and prints
its metric. Two runs started in one second in one folder share a run folder, as with Hydra.
"""

import sys
import time
from pathlib import Path


def main() -> None:
    cfg = {"lr": 0.1, "depth": 2, "data.path": "data/train.txt"}
    overrides = sys.argv[1:]
    for item in overrides:
        key, _, value = item.partition("=")
        cfg[key] = value
    now = time.localtime()
    run = Path("outputs") / time.strftime("%Y-%m-%d", now) / time.strftime("%H-%M-%S", now)
    (run / ".hydra").mkdir(parents=True, exist_ok=True)
    (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    rows = Path(cfg["data.path"]).read_text().split()  # relative to the folder it runs in
    loss = (float(cfg["lr"]) - 0.03) ** 2 + int(cfg["depth"]) * 0.01 + len(rows) * 1e-4
    with open(run / "main.log", "a") as log:
        log.write(f"loss={loss}\n")
    print(f"loss={loss}")


if __name__ == "__main__":
    main()
