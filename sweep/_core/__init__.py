"""What every part of sweep stands on: the errors a user sees, files written safely, YAML read
safely, placeholders, optional imports, the terminal, and the name of every attribute sweep
stores (`names`). Imports nothing of sweep."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sweep._core.faces import face

if TYPE_CHECKING:
    from sweep._core.errors import ConfigError, Problem, SweepError, UsageError, clip, short
    from sweep._core.faces import face as face
    from sweep._core.names import (
        ALIVE_UNTIL,
        ATTEMPT,
        BEAT,
        BRACKET,
        CALLED_OFF,
        CLEAN,
        CODE_VERSION,
        CONTINUES,
        DIR,
        DRIVER_PID,
        DRIVER_STARTED,
        EXIT_CODE,
        EXPLOIT_OF,
        EXPLOIT_STEP,
        FAIL_REASON,
        FIXED_PARAMS,
        GPU,
        GPU_MEM_PEAK_MB,
        GPUS,
        GRID_ID,
        HOST,
        IMAGE,
        LOGGED_PARAMS,
        METRIC_PREFIX,
        METRICS,
        OWNER,
        PASSED_RUNG,
        PAUSED_AT,
        PID,
        REPLACES,
        REPORTS_UNREAD,
        RERUN_OF,
        RESTORED_PARAMS,
        RESUMED_AT,
        RETRIES,
        RETRY_OF,
        RUN_ID,
        RUNG,
        SCHEDULER,
        STARTED,
        STEPS_REPEATED,
    )
    from sweep._core.optional import import_grpc
    from sweep._core.patterns import (
        LINE_TAIL,
        PatternTimeout,
        compile_pattern,
        finite_number,
        parse_stdout,
    )
    from sweep._core.placeholders import fill
    from sweep._core.removal import MARKER, mounts_at_or_under, removable, remove_tree
    from sweep._core.safefs import (
        DIR_FLAGS,
        UnsafePath,
        check_output_dir,
        file_problem,
        make_own_folder,
        open_for_writing,
        own_folder_problem,
        shared_folder_problem,
        write_file,
    )
    from sweep._core.secrets import secret_variable
    from sweep._core.terminal import release_dead_terminal

__all__, _face = face(__name__)
if not TYPE_CHECKING:
    __getattr__ = _face
