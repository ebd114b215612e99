"""A Hugging Face Trainer-style script that saves checkpoints, as `run_clm.py` does.

Not written for sweep: every `--save_steps` steps it writes `checkpoint-<step>/` under
`--output_dir` (the state first, `trainer_state.json` last), and it resumes only when told
`--resume_from_checkpoint PATH`; there is no automatic detection. It handles no signal: SIGTERM
ends it where it is. At the end it writes all_results.json into --output_dir.
"""

import argparse
import json
import math
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--learning_rate", type=float, default=5e-5)
    parser.add_argument("--max_steps", type=int, default=40)
    parser.add_argument("--save_steps", type=int, default=5)
    parser.add_argument("--step_seconds", type=float, default=0.05)
    parser.add_argument("--resume_from_checkpoint", default=None)
    args = parser.parse_args()
    os.makedirs(args.output_dir, exist_ok=True)
    step, loss = 0, 2.0
    if args.resume_from_checkpoint:
        with open(os.path.join(args.resume_from_checkpoint, "trainer_state.json")) as f:
            state = json.load(f)
        step, loss = state["global_step"], state["loss"]
        print(f"  Continuing training from checkpoint, will skip to saved global_step {step}",
              flush=True)
    first = step
    distance = abs(math.log10(args.learning_rate) + 4)
    while step < args.max_steps:
        time.sleep(args.step_seconds)
        step += 1
        loss = loss * 0.95 + 0.01 * distance
        print(json.dumps({"loss": round(loss, 5), "step": step}), flush=True)
        if step % args.save_steps == 0:
            folder = os.path.join(args.output_dir, f"checkpoint-{step}")
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "optimizer.pt"), "w") as f:
                f.write("state")
            with open(os.path.join(folder, "trainer_state.json"), "w") as f:
                json.dump({"global_step": step, "loss": loss}, f)
    results = {"eval_loss": loss + 0.1 * distance, "train_loss": loss, "global_step": step,
               "train_steps_this_run": step - first}
    with open(os.path.join(args.output_dir, "all_results.json"), "w") as f:
        json.dump(results, f, indent=4)
    print("***** eval metrics *****")
    for key, value in results.items():
        print(f"  {key:<15} = {value}")


if __name__ == "__main__":
    main()
