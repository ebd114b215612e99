"""sweep: Optuna hyperparameter sweeps where every trial runs on its own GPU."""

__version__ = "0.1.0"
