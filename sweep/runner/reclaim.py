"""Reclaiming the trials of drivers that are gone: what is left of their processes on this host
is ended, then each trial is told FAIL and its lineage queued to continue.

Which trials are orphans is `ownership.judge`'s decision (read through `Store.orphans`); this
module acts on it.
"""

from __future__ import annotations

from sweep.runner.events import Events
from sweep.study.store import Store
from sweep.trial import process


class Reclaimer:
    """The reclaims of one run."""

    def __init__(self, store: Store, events: Events) -> None:
        self.store = store
        self.events = events  # what the user is told goes there
        # in how many seconds a trial whose owner is unknown may become an orphan (None: none)
        self.wait: float | None = None

    def look(self, mine: set[int]) -> bool:
        """Tell FAIL, and queue again, the trials of drivers that are gone (`mine`: the
        numbers of this driver's own trials). True if any was told (the counts changed)."""
        orphans, self.wait = self.store.orphans(mine)
        told = False
        for orphan in orphans:
            if orphan.trial_dir:
                process.kill_leftovers(orphan.trial_dir)
            if self.store.fail_orphan(orphan):
                told = True
                self.events.message(
                    f"trial {orphan.trial.number}: {orphan.reason}; told FAIL, queued again")
        return told
