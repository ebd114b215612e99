"""`trainer.logged_params` in a PBT study, carried out: the values a trial's script logs are read
with its results, noted on the trial at each `interval` boundary (`LOGGED_PARAMS`), and an exploit's
explore is checked against its donor's notes once it has logged them all: a param it runs with
at its donor's value (restored from the checkpoint) is flagged (`RESTORED_PARAMS`) and said
once, with the fix. The judgement is `_explore`'s; this module reads, notes and says.
"""

from __future__ import annotations

from collections.abc import Callable

from sweep._core import LOGGED_PARAMS, RESTORED_PARAMS, names
from sweep.schedulers import _explore, history
from sweep.spec import Spec
from sweep.study import Store
from sweep.trial import RunningTrial, Start, intermediate, launch_plan, lineage


class ExploreCheck:
    """The explore checks of one driver's PBT exploits (`interval`: the population's, in
    steps); `say` gives the user one line."""

    def __init__(self, spec: Spec, store: Store, say: Callable[[str], None],
                 interval: int) -> None:
        self.spec, self.store, self.say, self.interval = spec, store, say, interval
        # each trial's start, readers, latest values and notes by boundary; the exploits
        # whose explore is not checked yet (their donor)
        self._starts: dict[int, Start] = {}
        self._readers: dict[int, dict[str, intermediate.IntermediateValues]] = {}
        self._logged: dict[int, dict[str, float]] = {}
        self._notes: dict[int, dict[str, dict[str, float]]] = {}
        self._explores: dict[int, int] = {}
        # an exploit's first logged values (its run, the step they came by): what it is judged
        # on if it ends before it passes a boundary its donor noted too
        self._first: dict[int, tuple[RunningTrial, int, dict[str, float]]] = {}
        self._said_restored = False

    def started(self, number: int, start: Start, donor: int | None) -> None:
        """Trial `number` starts from `start`; an exploit (of `donor`) is to be checked."""
        self._starts[number] = start
        if donor is not None:
            self._explores[number] = donor

    def forget(self, number: int) -> None:
        """Trial `number`'s processes are gone: what was kept for it goes."""
        for kept in (self._starts, self._readers, self._logged, self._notes, self._explores,
                     self._first):
            kept.pop(number, None)

    def on_result(self, run: RunningTrial, before: int | None, step: int) -> None:
        """`trainer.logged_params`: the values the script logged so far read; an exploit's
        explore checked once it has logged them all (at `step`, against its donor's notes);
        at an `interval` boundary, the latest noted on the trial (what an exploit of it is
        compared with)."""
        readers = self._readers.get(run.number)
        if readers is None:
            plan, start = run.process.plan, self._starts.get(run.number)
            places = {**launch_plan.spec_places(self.spec), "trial_dir": str(plan.paths.dir),
                      "trial_number": str(run.number),
                      **(lineage.places(start) if start is not None else {})}
            readers = self._readers[run.number] = {
                name: intermediate.reader_for(section, plan.paths, name, places, plan.cwd)
                for name, section in self.spec.trainer.logged_params.items()}
        latest = self._logged.setdefault(run.number, {})
        for name, reader in readers.items():
            fresh = reader.read_rest(1 << 20)
            if fresh:
                latest[name] = fresh[-1][1]
        if run.number in self._explores and len(latest) == len(readers):
            self._first.setdefault(run.number, (run, step, dict(latest)))
        at = _explore.boundary(before, step, self.interval)
        if at is not None and latest:
            notes = self._notes.setdefault(run.number, {})
            for name, value in latest.items():
                notes.setdefault(name, {})[str(at)] = value
            self.store.note(run.trial, {LOGGED_PARAMS: notes})
        if run.number in self._first and run.number in self._explores:
            self._check_explore(run.number, final=False)

    def _check_explore(self, number: int, final: bool) -> None:
        """Exploit `number` has logged its params: flag the ones it runs with at its donor's
        value (`_explore.restored`), compared at the same step, so that a schedule (a decayed
        or stepped learning rate) cannot hide it: at the first boundary both noted
        (`LOGGED_PARAMS`), once there is one for each; `final` (its processes are gone) with none,
        its first logged values against the donor's at the last boundary before them."""
        run, first_step, first = self._first[number]
        donor = self._explores[number]
        trials = self.store.study.get_trials(deepcopy=False)
        line = history.read(trials).get(donor)
        if line is None:
            return
        donor_notes: dict[str, dict[str, float]] = {}
        for t in trials:
            if int(t.user_attrs.get(names.RETRY_OF, t.number)) == donor:
                for name, notes in dict(t.user_attrs.get(LOGGED_PARAMS, {})).items():
                    donor_notes.setdefault(name, {}).update(notes)
        own = self._notes.get(number, {})
        pairs: dict[str, tuple[float, float | None]] = {}  # name -> (its value, the donor's)
        for name, value in first.items():
            theirs = donor_notes.get(name, {})
            common = sorted(int(b) for b in own.get(name, {}) if b in theirs)
            if common:
                pairs[name] = (own[name][str(common[0])], theirs[str(common[0])])
            elif final:
                pairs[name] = (value, _explore.at_or_before(theirs, first_step))
            else:
                return  # judged once its donor noted a boundary it noted (or it ends)
        del self._explores[number]
        found = {}
        for name, (value, reference) in pairs.items():
            given, theirs_given = run.params.get(name), line.params.get(name)
            if not isinstance(given, (int, float)) or not isinstance(theirs_given,
                                                                     (int, float)):
                continue
            if _explore.restored(value, reference, float(given), float(theirs_given)):
                found[name] = value
        if not found:
            return
        self.store.note(run.trial, {RESTORED_PARAMS: found})
        if self._said_restored:
            return
        self._said_restored = True
        shown = ", ".join(f"{k}={run.params[k]:g} but logged {v:g}" for k, v in found.items())
        self.say(f"trial {run.number} exploits trial {donor} with perturbed params ({shown}, "
                 "as its donor ran): it restored its donor's value from the checkpoint (an "
                 "optimizer's state holds its learning rate); have the script set the params "
                 "it is given after it loads the checkpoint (e.g. each optimizer param "
                 "group's lr, and a scheduler's base_lrs)")

    def results_read(self, run: RunningTrial) -> None:
        """`run`'s command exited and all its reports were read (it is about to be told): an
        exploit whose explore is not checked yet is checked on what it logged
        (`_check_explore`, `final`)."""
        if run.number in self._first and run.number in self._explores:
            self._check_explore(run.number, final=True)
