"""The names sweep stores attributes under are its stored format: a study an older sweep left
is read with them, so they never change. They are spelled out here, and only here in the
tests (the others use `sweep._core.names`), so that a change to one fails."""

from __future__ import annotations

from sweep._core import names

STORED = {
    "OWNER": "owner",
    "HOST": "host",
    "GPU": "gpu",
    "GPUS": "gpus",
    "PID": "pid",
    "STARTED": "started",
    "DIR": "dir",
    "DRIVER_PID": "driver_pid",
    "DRIVER_STARTED": "driver_started",
    "BEAT": "beat",
    "EXIT_CODE": "exit_code",
    "FAIL_REASON": "fail_reason",
    "ALIVE_UNTIL": "alive_until",
    "REPORTS_UNREAD": "reports_unread",
    "GPU_UTIL_MEAN": "gpu_util_mean",
    "GPU_UTIL_MAX": "gpu_util_max",
    "GPU_MEM_PEAK_MB": "gpu_mem_peak_mb",
    "ENERGY_J": "energy_j",
    "CODE_VERSION": "code_version",
    "IMAGE": "image",
    "METRIC_PREFIX": "metric_",
    "RETRY_OF": "retry_of",
    "ATTEMPT": "attempt",
    "CONTINUES": "continues",
    "RETRIES": "retries",
    "RUN_ID": "run_id",
    "CLEAN": "clean",
    "RERUN_OF": "rerun_of",
    "PAUSED_AT": "paused_at",
    "RUNG": "rung",
    "PASSED_RUNG": "passed_rung",
    "BRACKET": "bracket",
    "EXPLOIT_OF": "exploit_of",
    "EXPLOIT_STEP": "exploit_step",
    "REPLACES": "replaces",
    "CALLED_OFF": "called_off",
    "RESUMED_AT": "resumed_at",
    "STEPS_REPEATED": "steps_repeated",
    "LOGGED_PARAMS": "logged_params",
    "RESTORED_PARAMS": "restored_params",
    "METRICS": "metrics",
    "SCHEDULER": "scheduler",
    "FIXED_PARAMS": "fixed_params",
    "GRID_ID": "grid_id",
}


def test_every_stored_name_is_as_sweep_has_always_stored_it():
    assert {k: v for k, v in vars(names).items() if k.isupper() and isinstance(v, str)} \
        == STORED


def test_each_group_holds_names_of_the_module():
    groups = [names.DRIVER, names.ENDING, names.USAGE, names.RAN, names.LINEAGE,
              names.SCHEDULER_RECORDS, names.STUDY, names.OPTUNA]
    grouped = [n for group in groups for n in group]
    assert len(grouped) == len(set(grouped)) and set(grouped) <= set(STORED.values())
