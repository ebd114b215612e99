"""A script with dash-named options and store_true / store_false flags.

Not written for sweep: `--use-amp` and `--no-shuffle` take no value, and the options are
`--learning-rate` and `--batch-size`, not the param names.
"""

import argparse
import math


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--learning-rate", type=float, required=True)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--use-amp", action="store_true")
    parser.add_argument("--no-shuffle", dest="shuffle", action="store_false")
    args = parser.parse_args()
    loss = abs(math.log10(args.learning_rate) + 2) + (0.1 if args.use_amp else 0.0)
    loss += 0.01 * args.batch_size / 32 + (0.0 if args.shuffle else 0.5)
    print(f"config: lr={args.learning_rate} batch={args.batch_size} amp={args.use_amp} "
          f"shuffle={args.shuffle}")
    print(f"final loss {loss:.5f}")


if __name__ == "__main__":
    main()
