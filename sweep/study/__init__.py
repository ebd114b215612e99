"""The study in its Optuna storage: opening storages, SQLite and the gRPC proxy, the budget
lock, the store (ask, tell, counts, orphans), ownership and heartbeats, and the one shim over
Optuna's private names (`_optuna_compat`). Imports `_core`, `spec` and `trial`."""
