"""One trial as files and processes: its launch plan, the launchers (python, accelerate,
direct, warm), the guard and its process, the verdict on its files, its intermediate values,
hang and stacks, its lineage and checkpoint folder, its trial folder and its provenance.
Imports `_core`, `protocol`, `spec` and `gpus`; never Optuna."""
