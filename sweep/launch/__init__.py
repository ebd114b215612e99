"""How a trial starts: the `Launcher` a run has (`trainer.launcher`: accelerate, python, direct,
warm; any of them inside a container), the warm fork server and its client, the container
engine, and the record of what ran (provenance). The trial's files and processes it starts
are `sweep.trial`'s.
Imports `_core`, `protocol`, `spec`, `gpus` and `trial`; never Optuna.

Nothing is imported here: `python -m sweep.launch.warm_server` imports this package first,
and its server must start with the standard library alone."""
