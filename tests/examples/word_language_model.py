"""Output as pytorch/examples `word_language_model/main.py` prints it, with small values in
exponent notation (`1.23e-05`), as `{:.3g}` writes them.

Not written for sweep: plain argparse and print(). The "training" is a closed-form curve;
`--epoch-seconds` stands for the time an epoch takes.
"""

import argparse
import math
import time


def main() -> None:
    parser = argparse.ArgumentParser(description="PyTorch Wikitext-2 RNN/LSTM Language Model")
    parser.add_argument("--lr", type=float, default=20)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--dropout", type=float, default=0.2)
    parser.add_argument("--epoch-seconds", type=float, default=0.0)
    args = parser.parse_args()
    val_loss = math.inf
    for epoch in range(1, args.epochs + 1):
        epoch_start_time = time.time()
        time.sleep(args.epoch_seconds)
        cur_loss = 1e-6 * math.exp(-epoch * args.lr / 10) * (1 + 100 * args.dropout)
        print(f"| epoch {epoch:3d} | {200:5d}/{2983:5d} batches | lr {args.lr:02.2f} | "
              f"ms/batch {10.0:5.2f} | loss {cur_loss:.3g} | ppl {math.exp(cur_loss):8.2f}")
        val_loss = cur_loss * 1.05
        print("-" * 89)
        print(f"| end of epoch {epoch:3d} | time: {time.time() - epoch_start_time:5.2f}s | "
              f"valid loss {val_loss:.3g} | valid ppl {math.exp(val_loss):8.2f}")
        print("-" * 89)
    print("=" * 89)
    print(f"| End of training | test loss {val_loss:.3g} | test ppl {math.exp(val_loss):8.2f}")
    print("=" * 89)


if __name__ == "__main__":
    main()
