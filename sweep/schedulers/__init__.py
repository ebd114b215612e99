"""`study.scheduler` (asha, hyperband, pbt): what a scheduler decides, its budget in
configurations, the checkpoint disk it keeps and tidies, and the carrying out of it all for one
run, behind the hooks the runner tells a scheduler at (`TrialScheduler`; `NoScheduler` for a
study without one). The runner makes the run's scheduler (`of`) and tells it; `analysis` reads
the pure modules (`history`, `halving`); the commands count a study's configurations.

The decisions are pure, each module one job: `history` (a lineage as the study stores it),
`halving` (successive halving: rungs, pause, promote, brackets), `pbt` (exploit: which
lineage is replaced, by a copy of which), `_explore` (the donor's params perturbed, and whether
an exploit ran with them), `budget` (what a study may start, in configurations), `_retention`
(which checkpoint folders go). Their side effects: `exploit_copy` (a donor's state copied),
`_disk` (the checkpoint folders' bytes, one removed), and `run` (`Scheduling`: the one place the
decisions touch the study and the trials, with `_exploit_start`, `_explore_check` and
`_tidy`).

Imports `_core`, `spec`, `trial` and `study`; never `runner`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sweep._core import face

if TYPE_CHECKING:
    from sweep.schedulers.api import NO_SCHEDULER, NotStarted, TrialScheduler
    from sweep.schedulers.budget import configurations, decisions, jobs, short_of
    from sweep.schedulers.exploit_copy import CalledOff
    from sweep.schedulers.halving import rungs
    from sweep.schedulers.pbt import Pbt
    from sweep.schedulers.run import of

__all__, _face = face(__name__)
if not TYPE_CHECKING:
    __getattr__ = _face
