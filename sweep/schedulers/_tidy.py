"""The checkpoint disk of a scheduler's study tidied: the folders of lineages that can never
continue (or, over `max_checkpoint_gb`, the ones `_retention` picks) measured before the budget
lock, decided and taken out of their place under it (`_disk.retire`, a rename), where
every promotion and exploit is decided, and their contents removed after it
(`_disk.purge`), so a large folder never holds the lock. It is done after each trial's end,
and under `max_checkpoint_gb` before each exploit's copy of its donor's state too
(`make_room`: the copy counted as there already), so that sweep's own copy never takes the
folders over the bound while a folder that may go is left. The decisions are `_retention`'s;
this module measures, removes and says.
"""

from __future__ import annotations

from collections.abc import Callable

from sweep._core import UnsafePath
from sweep.schedulers import _disk, _retention, history
from sweep.schedulers.halving import Halving
from sweep.schedulers.history import History
from sweep.schedulers.pbt import Pbt
from sweep.spec import Spec
from sweep.study import Store
from sweep.trial import lineage


class CheckpointTidy:
    """The tidying of one driver's checkpoint disk (`decide`: the study's scheduler's
    decisions); `say` gives the user one line."""

    def __init__(self, spec: Spec, store: Store, decide: Halving | Pbt,
                 say: Callable[[str], None]) -> None:
        self.spec, self.store, self.decide, self.say = spec, store, decide, say
        self.minimize = spec.study.objective_directions[0] == "minimize"
        self._said_over = False
        self._refused: set[int] = set()  # folders sweep would not remove: said once each
        self._refused_trash: set[str] = set()  # retired folders it would not purge, likewise

    def lineages(self) -> dict[int, History]:
        return history.read(self.store.study.get_trials(deepcopy=False))

    def make_room(self, incoming: int) -> None:
        """Under `max_checkpoint_gb`, before a copy that adds `incoming` bytes to the folders
        (an exploit's of its donor's state): `tidy` as if the copy were there already, so
        the folders that may go (the lineage the exploit replaces first) are gone before it
        is made, not at the next trial's end. Nothing without a bound."""
        sched = self.spec.study.scheduler
        assert sched is not None
        if sched.max_checkpoint_gb is not None:
            self.tidy(incoming=incoming)

    def tidy(self, abort: Callable[[], bool] = lambda: False, incoming: int = 0) -> None:
        """Remove the checkpoint folders of lineages that can never continue, as `_retention`
        decides: measured before the budget lock, decided and taken out of their place
        (`_disk.retire`, a rename) under it, where every promotion and exploit is
        decided, and their contents removed after it (`_disk.purge`), so a large
        folder never holds the lock; over `max_checkpoint_gb` with nothing left to remove,
        say so once. `incoming`: the bytes of a copy about to be made, counted as held."""
        sched = self.spec.study.scheduler
        assert sched is not None
        if sched.keep_checkpoints == "all" and sched.max_checkpoint_gb is None:
            return
        out = self.spec.output_dir
        sizes = self._measure(self.lineages(), sched.max_checkpoint_gb is not None)
        retired = []
        with self.store.budget_lock(abort) as held:
            if not held:  # another driver holds it too long: decide another time
                return
            lines = self.lineages()
            dead = _retention.never_continue(lines, self.decide, self.spec.study.n_trials)
            chosen = _retention.plan(lines, dead, sizes, sched.keep_checkpoints,
                                    sched.max_checkpoint_gb, self.minimize,
                                    _retention.spared(lines), incoming)
            for origin in chosen.remove:
                if origin in self._refused:
                    continue
                try:
                    if _disk.retire(out, origin) is None:
                        continue  # a straggler of it still ends: another time
                except UnsafePath as e:
                    self._refused.add(origin)
                    self.say(f"the checkpoint folder of trial {origin} is kept: {e}")
                    continue
                retired.append(origin)
        self._purge()
        if retired:
            freed = sum(sizes[o] for o in retired)
            self.say(f"checkpoint folders removed ({_bytes(freed)}) of trials "
                     f"{', '.join(map(str, retired))}: they can never continue")
        if chosen.over and not self._said_over:
            self._said_over = True
            self.say(f"the checkpoint folders in {out / lineage.CHECKPOINTS} hold "
                     f"{_bytes(chosen.held)}, over study.scheduler."
                     f"max_checkpoint_gb ({sched.max_checkpoint_gb:g}), and what is left "
                     "belongs to lineages that may still continue (or the best finished one): "
                     "sweep removes none of those; raise the bound, or free disk elsewhere")

    def _measure(self, lines: dict[int, History], bounded: bool) -> dict[int, int]:
        """The bytes in the folders `_retention.plan` weighs, as they are now (another driver
        or the user may have removed some): every lineage's under a bound, else those that
        can never continue."""
        wanted = lines if bounded else _retention.never_continue(
            lines, self.decide, self.spec.study.n_trials)
        return _disk.sizes(self.spec.output_dir, sorted(wanted))

    def _purge(self) -> None:
        """The retired folders' contents removed (`_disk.purge`); each refused is
        said once."""
        for e in _disk.purge(self.spec.output_dir)[1]:
            if e.path not in self._refused_trash:
                self._refused_trash.add(e.path)
                self.say(f"a retired checkpoint folder is kept: {e}")


def _bytes(n: float) -> str:
    """`n` bytes in decimal units, as max_checkpoint_gb counts them: 812 B, 3.4 MB, 1.20 GB
    (rounded to 3 digits first: 999,999 B is 1 MB)."""
    rounded = float(f"{n:.3g}")
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if rounded >= size:
            return f"{n / size:.3g} {unit}" if unit != "GB" else f"{n / size:.2f} GB"
    return f"{n:.0f} B"
