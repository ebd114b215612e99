"""A Hugging Face Trainer-style script: it writes all_results.json into --output_dir.

Not written for sweep: the metrics go where the script always puts them.
"""

import argparse
import json
import math
import os


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--learning_rate", type=float, default=5e-5)
    parser.add_argument("--num_train_epochs", type=float, default=3.0)
    parser.add_argument("--per_device_train_batch_size", type=int, default=8)
    parser.add_argument("--warmup_ratio", type=float, default=0.0)
    args = parser.parse_args()
    os.makedirs(args.output_dir, exist_ok=True)
    distance = abs(math.log10(args.learning_rate) + 4) + args.warmup_ratio
    eval_loss = 0.3 + 0.2 * distance / args.num_train_epochs
    results = {
        "epoch": args.num_train_epochs,
        "eval_accuracy": round(1 - eval_loss / 2, 4),
        "eval_loss": eval_loss,
        "eval_runtime": 1.5,
        "train_loss": eval_loss * 0.9,
        "train_samples": 1000,
    }
    for name in ("all_results.json", "eval_results.json"):
        with open(os.path.join(args.output_dir, name), "w") as f:
            json.dump(results, f, indent=4)
    print("***** eval metrics *****")
    for key, value in results.items():
        print(f"  {key:<15} = {value}")


if __name__ == "__main__":
    main()
