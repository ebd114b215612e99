"""Output as timm's `train.py` logs it: through Python's `logging`, which writes to stderr.
Nothing is printed on stdout. Not written for sweep."""

import argparse
import logging

_logger = logging.getLogger("train")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # a StreamHandler: stderr
    parser = argparse.ArgumentParser(description="PyTorch ImageNet Training")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    best_metric, best_epoch = None, None
    for epoch in range(args.epochs):
        loss = 6.9 / (1 + epoch * args.lr * 10)
        _logger.info(f"Train: {epoch} [  99/100 (100%)]  Loss: {loss:#.3g} ({loss:#.3g})  "
                     f"LR: {args.lr:.3e}")
        top1 = min(99.0, 50 + epoch * args.lr * 100)
        _logger.info(f"Test: [   9/9]  Time: 0.010 (0.020)  Loss: {loss:>7.3f} ({loss:>7.3f})  "
                     f"Acc@1: {top1:>7.3f} ({top1:>7.3f})  Acc@5: {top1:>7.3f} ({top1:>7.3f})")
        if best_metric is None or top1 > best_metric:
            best_metric, best_epoch = top1, epoch
    _logger.info(f"*** Best metric: {best_metric} (epoch {best_epoch})")


if __name__ == "__main__":
    main()
