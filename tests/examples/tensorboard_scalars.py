"""A training script that logs its metrics to TensorBoard only (torch's SummaryWriter), as
HF's `report_to tensorboard` and Lightning do: nothing on stdout that sweep could read.

Not written for sweep. It flushes after each evaluation, as HF's TensorBoardCallback does.
The "training" is a closed-form loss curve; `--epoch-seconds` stands for an epoch's time.
"""

import argparse
import json
import math
import time
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter


def main() -> None:
    parser = argparse.ArgumentParser(description="a model that logs to TensorBoard")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--epoch-seconds", type=float, default=0.0)
    parser.add_argument("--output-dir", default="out")
    args = parser.parse_args()
    writer = SummaryWriter(str(Path(args.output_dir) / "runs"))
    loss = 3.0
    for epoch in range(args.epochs):
        time.sleep(args.epoch_seconds)
        loss = 2.0 * math.exp(-args.lr * (epoch + 1)) + abs(math.log10(args.lr))
        writer.add_scalar("train/loss", loss * 0.9, epoch * 100)
        writer.add_scalar("eval/loss", loss, epoch * 100)
        writer.flush()
    writer.close()
    (Path(args.output_dir) / "all_results.json").write_text(json.dumps({"eval_loss": loss}))


if __name__ == "__main__":
    main()
