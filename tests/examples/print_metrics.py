"""An MNIST-style training script that only prints its metrics (as pytorch/examples does).

Not written for sweep: plain argparse, no result file. The "training" is a closed-form loss
curve so it runs in milliseconds anywhere.
"""

import argparse
import math
import random


def main() -> None:
    parser = argparse.ArgumentParser(description="MNIST-like example")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    loss = 2.3
    for epoch in range(1, args.epochs + 1):
        for batch in range(3):
            loss *= 1 - min(0.5, args.lr * args.gamma**epoch / 4)
            loss += abs(math.log10(args.lr)) * 0.01 + rng.random() * 0.001
            print(f"Train Epoch: {epoch} [{batch * args.batch_size}/60000 "
                  f"({batch / 3:.0%})]\tLoss: {loss:.6f}")
        correct = int(10000 * max(0.1, min(0.99, 1 - loss / 2.5)))
        print(f"\nTest set: Average loss: {loss:.4f}, Accuracy: {correct}/10000 "
              f"({correct / 100:.0f}%)\n")


if __name__ == "__main__":
    main()
