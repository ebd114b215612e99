"""A training script that logs one line per epoch (`epoch N ... valid loss X`), as many do.

Not written for sweep: plain argparse, print(), no result file, no report calls. The
"training" is a closed-form loss curve; `--epoch-seconds` stands for the time an epoch takes.
"""

import argparse
import math
import time


def main() -> None:
    parser = argparse.ArgumentParser(description="a model trained for some epochs")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--epoch-seconds", type=float, default=0.0)
    args = parser.parse_args()
    valid = 3.0
    for epoch in range(1, args.epochs + 1):
        time.sleep(args.epoch_seconds)
        train = 2.0 * math.exp(-args.lr * epoch) + abs(math.log10(args.lr))
        valid = train * 1.1
        print(f"epoch {epoch} | {epoch * 100} steps | train loss {train:.4f} | "
              f"valid loss {valid:.4f}")
    print(f"done: best valid loss {valid:.4f}")


if __name__ == "__main__":
    main()
