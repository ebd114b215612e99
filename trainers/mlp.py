"""Train an MLP on a deterministic synthetic classification set with Accelerate.

A real example trainer for sweep: run it by hand (`accelerate launch trainers/mlp.py --lr 0.01`)
or as a sweep trial (`python -m sweep run studies/quickstart.yaml`). It reads its params as
`--name value`, reports the validation loss each epoch (for pruning), stops early when the
driver asks (pruned, timeout, Ctrl-C), logs to TensorBoard in $SWEEP_TRIAL_DIR when tensorboard
is installed, and writes {"val_loss", "val_acc", "n_params"} to $SWEEP_RESULT_FILE.
Runs in seconds on a CPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import os

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from sweep.protocol import report, should_stop, write_result


def make_data(n: int, features: int, classes: int, seed: int) -> TensorDataset:
    """Points labelled by a fixed random teacher network, so the task is learnable."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    teacher = torch.randn(features, 32, generator=g), torch.randn(32, classes, generator=g)
    y = (torch.tanh(x @ teacher[0]) @ teacher[1]).argmax(dim=1)
    return TensorDataset(x, y)


def build_model(features: int, hidden: int, layers: int, classes: int, act: str) -> nn.Module:
    activation = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh}[act]
    blocks: list[nn.Module] = []
    width = features
    for _ in range(layers):
        blocks += [nn.Linear(width, hidden), activation()]
        width = hidden
    return nn.Sequential(*blocks, nn.Linear(width, classes))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--act", default="relu", choices=["relu", "gelu", "tanh"])
    p.add_argument("--weight_decay", type=float, default=0.0)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    should_stop()  # take over SIGTERM: finish the epoch, write what we have, exit

    trial_dir = os.environ.get("SWEEP_TRIAL_DIR")
    use_tb = trial_dir is not None and importlib.util.find_spec("tensorboard") is not None
    accelerator = Accelerator(log_with="tensorboard" if use_tb else None, project_dir=trial_dir)
    if use_tb:
        accelerator.init_trackers("tb", config=vars(args))
    set_seed(args.seed)

    features, classes = 20, 4
    data = make_data(args.samples, features, classes, seed=1234)
    n_val = len(data) // 5
    train, val = torch.utils.data.random_split(
        data, [len(data) - n_val, n_val], generator=torch.Generator().manual_seed(0)
    )
    train_dl = DataLoader(train, batch_size=args.batch_size, shuffle=True)
    val_dl = DataLoader(val, batch_size=256)
    model = build_model(features, args.hidden, args.layers, classes, args.act)
    n_params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    model, optimizer, train_dl, val_dl = accelerator.prepare(model, optimizer, train_dl, val_dl)
    loss_fn = nn.CrossEntropyLoss()

    val_loss, val_acc = float("nan"), float("nan")
    for epoch in range(args.epochs):
        model.train()
        for x, y in train_dl:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
        model.eval()
        total, correct, seen = 0.0, 0, 0
        with torch.no_grad():
            for x, y in val_dl:
                logits = model(x)
                total += loss_fn(logits.float(), y).item() * len(y)
                correct += (logits.argmax(dim=1) == y).sum().item()
                seen += len(y)
        val_loss, val_acc = total / seen, correct / seen
        accelerator.print(f"epoch {epoch}: val_loss={val_loss:.4f} val_acc={val_acc:.3f}")
        accelerator.log({"val_loss": val_loss, "val_acc": val_acc}, step=epoch)
        if accelerator.is_main_process:
            report(epoch, val_loss)
        if should_stop():
            accelerator.print("stop requested: ending early")
            break

    accelerator.end_training()
    if accelerator.is_main_process:
        write_result({"val_loss": val_loss, "val_acc": val_acc, "n_params": n_params})


if __name__ == "__main__":
    main()
