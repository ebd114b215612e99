"""Every attribute sweep stores on a trial or a study (Optuna's user attributes), and the few
of Optuna's own system attributes it reads: one name each, grouped by what writes them.

These names are the stored format: a study an older sweep left is read with them, so a value
here never changes. Other modules read the names from here, never spell them
(`tests/test_architecture.py` fails on a stored attribute's name written out in `sweep/`).
Imports nothing.
"""

from __future__ import annotations

# ---- a trial's driver and devices --------------------------------------------------------

OWNER = "owner"
"""The driver that runs the trial, written right after its first heartbeat and before its
trainer starts: a dict of HOST, PID, STARTED (the driver process's start time, epoch s: pids
are reused), GPU, DIR (the trial's folder) and GPUS for a trial of several devices
(`sweep.study.attrs.OwnerRecord`)."""
HOST = "host"
"""The host the trial ran on (an attribute once its trainer started, and when it is told;
a key of the OWNER record)."""
GPU = "gpu"
"""The device the trial ran on, its first for a trial of several (an attribute once its trainer
started, and when it is told, where it had one; a key of the OWNER record)."""
GPUS = "gpus"
"""A trial of several devices: all of them, as "0,1" (an attribute; a key of OWNER)."""
PID, STARTED, DIR = "pid", "started", "dir"
"""Keys of the OWNER record: the driver's pid and start time, the trial's folder."""
DRIVER_PID, DRIVER_STARTED = "driver_pid", "driver_started"
"""sweep 0.1's loose owner attributes (beside HOST), read still, never written."""
BEAT = "beat"
"""The driver's heartbeat (epoch s) where the storage has none of Optuna's (journal, proxy)."""
DRIVER = (OWNER, HOST, GPU, GPUS, BEAT)
"""The trial's driver and devices. The OWNER record's keys: HOST, PID, STARTED, GPU, DIR, GPUS."""

# ---- how a trial ended -------------------------------------------------------------------

EXIT_CODE = "exit_code"
"""The trainer command's exit code."""
FAIL_REASON = "fail_reason"
"""A FAIL trial's one-line reason ("interrupted": `sweep.trial.running.Stop.INTERRUPTED`)."""
ALIVE_UNTIL = "alive_until"
"""A trial told FAIL by a reclaim: its driver's last sign of life (epoch s) where one was found
(its BEAT, its driver's last GPU sample of it): when it stopped holding its devices."""
REPORTS_UNREAD = "reports_unread"
"""What of the trial's intermediate values was left unread when the run was interrupted."""
ENDING = (EXIT_CODE, FAIL_REASON, ALIVE_UNTIL, REPORTS_UNREAD)
"""How the trial ended, beside its state."""

# ---- what a trial used -------------------------------------------------------------------

GPU_UTIL_MEAN, GPU_UTIL_MAX = "gpu_util_mean", "gpu_util_max"
"""The trial's devices' sampled utilisation (%), mean and maximum; NaN where none was."""
GPU_MEM_PEAK_MB = "gpu_mem_peak_mb"
"""The most device memory (MB) the trial's processes held, as sampled."""
ENERGY_J = "energy_j"
"""The energy (J) its devices' NVML counters gave while it ran."""
USAGE = (GPU_UTIL_MEAN, GPU_UTIL_MAX, GPU_MEM_PEAK_MB, ENERGY_J)
"""What the GPU monitor measured of a trial, stored as it is told."""

# ---- what a trial ran, and what it returned ----------------------------------------------

CODE_VERSION = "code_version"
"""The trainer's code: its commit's first 12 digits, `+` 8 of its diff's hash when dirty
(`+unknown` when git could not say); also a key of env.json."""
IMAGE = "image"
"""`trainer.container`'s image ID (also a key of env.json)."""
METRIC_PREFIX = "metric_"
"""Before each of the result's other numeric keys: a namespace of their own."""
RAN = (CODE_VERSION, IMAGE)
"""What the trial ran: one write per run's attribute (`env_version` stays in env.json)."""

# ---- a trial's lineage -------------------------------------------------------------------

RETRY_OF = "retry_of"
"""The number of the lineage's first attempt (none on the first attempt itself)."""
ATTEMPT = "attempt"
"""The attempt's place in its lineage: 0 for the first, n for the n-th after it."""
CONTINUES = "continues"
"""The number of the attempt this one carries on."""
RETRIES = "retries"
"""The retries after a real failure in the lineage so far (bounded by max_retries)."""
RUN_ID = "run_id"
"""SWEEP_RUN_ID: the same for every attempt of the lineage."""
CLEAN = "clean"
"""True: this attempt starts clean (a retry with trainer.retry_from: clean)."""
RERUN_OF = "rerun_of"
"""`sweep rerun`: the trial whose params this one runs again (no lineage of it)."""
LINEAGE = (RETRY_OF, ATTEMPT, CONTINUES, RETRIES, RUN_ID, CLEAN, RERUN_OF)
"""The attempts of one trial (`sweep.trial.lineage`), carried so that any driver of the study
that asks a queued attempt finds where it stands."""

# ---- a scheduler's decisions -------------------------------------------------------------

PAUSED_AT = "paused_at"
"""The step a paused attempt was stopped at; set before it is told."""
RUNG = "rung"
"""The rung an attempt was paused at."""
PASSED_RUNG = "passed_rung"
"""The highest rung an attempt was judged at and went on from."""
BRACKET = "bracket"
"""A Hyperband lineage's bracket."""
EXPLOIT_OF = "exploit_of"
"""A PBT exploit: the lineage whose checkpoint folder it was copied from (its donor)."""
EXPLOIT_STEP = "exploit_step"
"""A PBT exploit: the step of the donor's state copied; set once the copy is made."""
REPLACES = "replaces"
"""A PBT exploit: the lineage it takes the place of."""
CALLED_OFF = "called_off"
"""An exploit that never started (its donor had no state with a step left): the lineage it
was to replace goes on."""
RESUMED_AT = "resumed_at"
"""A continuation whose first step did not come after the step its lineage had reached: that
first step."""
STEPS_REPEATED = "steps_repeated"
"""Such a continuation: how many of its lineage's steps it trained again."""
LOGGED_PARAMS = "logged_params"
"""The values a PBT trial's script logged for its `trainer.logged_params`, at each `interval`
boundary."""
RESTORED_PARAMS = "restored_params"
"""An exploit whose script logged its donor's value of a param, not its perturbed one:
{name: logged value}."""
SCHEDULER_RECORDS = (PAUSED_AT, RUNG, PASSED_RUNG, BRACKET, EXPLOIT_OF, EXPLOIT_STEP,
                     REPLACES, CALLED_OFF, RESUMED_AT, STEPS_REPEATED, LOGGED_PARAMS,
                     RESTORED_PARAMS)
"""`study.scheduler`'s decisions, recorded on the attempts so that every driver of the study
reads the same lineages (`sweep.schedulers.history`)."""

# ---- a study's own attributes ------------------------------------------------------------

METRICS = "metrics"
"""The result keys the objective values come from (`study.metric(s)` of its first run)."""
SCHEDULER = "scheduler"
"""`study.scheduler`'s settings in the study's last run."""
STUDY = (METRICS, SCHEDULER)
"""The study's user attributes: what a later run of it is checked against."""

# ---- Optuna's own system attributes, read ------------------------------------------------

FIXED_PARAMS = "fixed_params"
"""A queued trial's params (`enqueue_trial`), before it is asked."""
GRID_ID = "grid_id"
"""The grid sampler's point of a trial."""
OPTUNA = (FIXED_PARAMS, GRID_ID)
"""Written by Optuna, read by sweep; never written by it."""
