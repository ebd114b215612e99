"""One trial as files and processes: its launch plan and command script, the guard and its
process, the running record, the verdict on its files, its intermediate values, hang and stacks,
its lineage and checkpoint folder, its trial folder. How a trial starts (the launchers) is
`sweep.launch`'s.
Imports `_core`, `protocol`, `spec` and `gpus`; of Optuna only `TrialState`, the state a
verdict tells (`outcome`)."""
