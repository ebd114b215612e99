"""A script whose loss diverges with a large learning rate: it prints `loss 2.5`, then
`loss nan`, as a training run that blew up does. Not written for sweep."""

import argparse


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()
    loss = 2.5
    for step in range(3):
        print(f"step {step} loss {loss}")
        loss = loss * 10 * args.lr if args.lr < 1 else float("nan")


if __name__ == "__main__":
    main()
