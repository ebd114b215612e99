"""Device slots shared by the sweeps of one host: flocked files, freed when a driver dies."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import load_trials, run_cli, spawn_cli, study_dict, wait_until

from sweep.gpus.hostlock import HostSlots, take_port
from sweep.gpus.placement import Refusal, Why
from sweep.gpus.pool import Lease, Pool, fake_devices
from sweep.testing.fakes import lease


def test_slots_are_shared_by_every_holder_on_the_host(tmp_path):
    a, b = HostSlots(tmp_path, 2), HostSlots(tmp_path, 2)
    first, second = a.take("gpu0"), b.take("gpu0")
    assert first and second and b.take("gpu0") is None
    assert a.held("gpu0") == b.held("gpu0") == 2
    first.release()
    assert a.held("gpu0") == 1 and b.take("gpu0") is not None


def test_a_device_holds_no_more_trials_than_the_strictest_sweep_on_it_allows(tmp_path):
    """A sweep with trials_per_gpu 1 has its device alone, whoever came first."""
    alone, shared = HostSlots(tmp_path, 1), HostSlots(tmp_path, 2)
    first = alone.take("gpu0")
    assert first is not None and shared.take("gpu0") is None  # it counts on being alone
    first.release()
    mine = shared.take("gpu0")
    assert mine is not None and alone.take("gpu0") is None  # one trial there already
    assert shared.take("gpu0") is not None  # a sweep of 2 may add its second
    assert HostSlots(tmp_path, 3).take("gpu0") is None  # 2 held, and a holder allows 2


def test_a_pool_leases_least_loaded_first_across_sweeps(tmp_path):
    mine = Pool(fake_devices("3"), capacity=2, host=HostSlots(tmp_path, 2))
    theirs = Pool(fake_devices("3"), capacity=2, host=HostSlots(tmp_path, 2))
    held = [lease(theirs, t) for t in range(3)]
    assert [x.device for x in held] == [0, 1, 2]  # spread
    assert [lease(mine, t).device for t in range(3)] == [0, 1, 2]  # then stack
    assert mine.acquire() == Refusal(Why.BLOCKED, "other sweeps of this host hold the devices")
    theirs.release(held[1])
    reserved = mine.acquire()
    assert isinstance(reserved, Lease) and reserved.device == 1  # its host slot is held
    assert not isinstance(theirs.acquire(), Lease)
    mine.release(reserved)
    assert lease(theirs, 9).device == 1


def test_the_slots_of_a_killed_driver_free_within_a_second(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from pathlib import Path
        from sweep.gpus.hostlock import HostSlots
        slot = HostSlots(Path({str(tmp_path)!r}), 1).take("gpu0")
        print("held", flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    slots = HostSlots(tmp_path, 1)
    assert slots.take("gpu0") is None
    holder.kill()
    killed = time.monotonic()
    assert wait_until(lambda: slots.held("gpu0") == 0, 1.0)
    assert time.monotonic() - killed < 1.0


@pytest.mark.slow
def test_two_drivers_on_one_host_never_share_a_device(write_study, tmp_path, fake_gpus,
                                                      capsys):
    """Issue 11: two sweeps started together put pairs of trials on the same device. Sweep b
    is a process of its own; sweep a runs in this process once b's first trial started (b's
    imports done: from then on each wants both devices for 2 s or more)."""
    studies = [write_study(study_dict(study={"name": name, "n_trials": 4},
                                      trainer={"args": ["--sleep", "1"]}),
                           name=f"{name}.yaml") for name in ("a", "b")]
    other = spawn_cli("run", str(studies[1]), env={"SWEEP_FAKE_GPUS": "2"})
    assert wait_until(lambda: list((tmp_path / "b" / "trials").glob("*/probe_start.json")), 60,
                      every=0.1)
    assert run_cli("run", str(studies[0])) == 0, capsys.readouterr().err
    _, err = other.communicate(timeout=120)
    assert other.returncode == 0, err
    runs = []
    for name, study in zip(("a", "b"), studies, strict=True):
        assert [t.state.name for t in load_trials(study, name)] == ["COMPLETE"] * 4
        for f in (tmp_path / name / "trials").glob("*/probe.json"):
            record = json.loads(f.read_text())
            runs.append((record["cvd"], record["start"], record["end"], name))
    for cvd, start, end, name in runs:
        for cvd2, start2, end2, name2 in runs:
            if (cvd, start, name) != (cvd2, start2, name2) and cvd == cvd2:
                assert end <= start2 or end2 <= start, (cvd, name, name2)
    assert {name for *_, name in runs} == {"a", "b"}


@pytest.mark.slow
def test_a_killed_drivers_slot_is_held_until_its_trial_is_gone(write_study, own_lock_dir):
    """The guard keeps the device's slot: no other sweep gets a GPU whose memory a stopping
    trainer of a dead driver still holds."""
    study = write_study(study={"n_trials": 1}, trainer={"args": ["--mode", "stubborn"],
                                                        "grace_period": 2.0})
    driver = spawn_cli("run", str(study), env={"SWEEP_FAKE_GPUS": "1"})
    trials = study.parent / "probe" / "trials"
    assert wait_until(lambda: list(trials.glob("*/probe_start.json")), 30)
    slots = HostSlots(next(own_lock_dir.iterdir()), 1)
    driver.kill()
    driver.wait()
    time.sleep(0.5)
    assert slots.held("sim0") == 1  # the stubborn trainer is in its grace period
    assert wait_until(lambda: slots.held("sim0") == 0, 10)  # then the slot frees


def test_old_style_mig_uuids_with_slashes_are_leased_like_any_device(tmp_path):
    key = "MIG-GPU-5e1f2c3a-0000-0000-0000-000000000000/1/0"
    a, b = HostSlots(tmp_path, 1), HostSlots(tmp_path, 1)
    held = a.take(key)
    assert held is not None and b.take(key) is None and b.held(key) == 1
    assert all("/" not in p.name for p in tmp_path.iterdir())


def test_a_sweep_stopped_inside_take_does_not_hang_the_others(tmp_path):
    import fcntl

    stuck = open(tmp_path / "gpu0.mutex", "a")  # noqa: SIM115 (a SIGSTOPped sweep's hold)
    fcntl.flock(stuck, fcntl.LOCK_EX)
    try:
        t0 = time.monotonic()
        assert HostSlots(tmp_path, 1).take("gpu0") is None  # looked at again later
        assert time.monotonic() - t0 < 5
    finally:
        stuck.close()
    assert HostSlots(tmp_path, 1).take("gpu0") is not None


def test_a_device_other_sweeps_fill_is_waited_for_not_given_up(tmp_path):
    """Their trial's memory makes it refuse ours now, but their trial will end."""
    from test_placement import FakeProbe, devices

    from sweep.gpus.placement import DeviceLook
    from sweep.gpus.pool import Rules

    theirs = HostSlots(tmp_path, 1).take("GPU-0")
    assert theirs is not None
    probe = FakeProbe({0: DeviceLook(80 * 1024, 70 * 1024, {})})
    mine = Pool(devices(1), 16, host=HostSlots(tmp_path, 16), probe=probe,
                rules=Rules(want_mb=20 * 1024, hopeless_after=0))
    assert mine.acquire() == Refusal(  # waited for, as the README says
        Why.BLOCKED, "GPU 0: 10240 MB free for a trial that needs 20480 MB")
    theirs.release()


# ---- issue 26 item 6: what another user put in the shared lock folder is not trusted ----

NOBODY = 65534


def test_a_lock_file_planted_as_a_link_is_never_followed(own_lock_dir, tmp_path):
    """Another user who made symlinks named like sweep's lock files had root's sweep create
    files where they pointed."""
    from sweep._core.safefs import UnsafePath
    from sweep.gpus.hostlock import lock_dir

    folder = lock_dir("host")
    target = tmp_path / "victim-dir" / "chosen"
    target.parent.mkdir()
    (folder / "gpu0.mutex").symlink_to(target)
    with pytest.raises(UnsafePath, match=r"gpu0.mutex is not a regular file"):
        HostSlots(folder, 1).take("gpu0")
    assert not target.exists()
    (folder / "gpu0.mutex").unlink()
    (folder / "gpu0.0.lock").symlink_to(target)
    with pytest.raises(UnsafePath, match=r"gpu0.0.lock is not a regular file"):
        HostSlots(folder, 1).take("gpu0")
    assert not target.exists()
    os.mkfifo(folder / "port.29600.lock")  # a FIFO would block a read-only open
    with pytest.raises(UnsafePath, match=r"port.29600.lock is not a regular file"):
        take_port(folder, range(29600, 29601))


def test_a_host_folder_planted_as_a_link_is_refused(own_lock_dir, tmp_path):
    from sweep._core.safefs import UnsafePath
    from sweep.gpus.hostlock import lock_dir

    elsewhere = tmp_path / "theirs"
    elsewhere.mkdir()
    own_lock_dir.mkdir(mode=0o1777)
    (own_lock_dir / "host").symlink_to(elsewhere)
    with pytest.raises(UnsafePath, match=r"host is a symbolic link or not a folder: remove "
                       r"it, or set \$SWEEP_LOCK_DIR to a folder of your own"):
        lock_dir("host")
    with pytest.raises(UnsafePath):
        HostSlots(own_lock_dir / "host", 1).take("gpu0")
    assert list(elsewhere.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a folder to another user")
def test_another_users_host_folder_is_used_only_if_sticky(own_lock_dir):
    """Sweeps of different users still share the host's slots (never one device twice), in
    a folder another user made, as long as no one may replace the files of others there."""
    from sweep._core.safefs import UnsafePath
    from sweep.gpus.hostlock import lock_dir

    own_lock_dir.mkdir(mode=0o755)
    own_lock_dir.chmod(0o1777)
    theirs = own_lock_dir / "host"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    theirs.chmod(0o777)
    with pytest.raises(UnsafePath, match=r"host is owned by nobody and writable by others "
                       r"without the sticky bit \(mode 777\)"):
        lock_dir("host")
    theirs.chmod(0o1777)
    assert lock_dir("host") == theirs
    held = theirs / "gpu0.0.lock"  # their sweep's slot file: locked read-only here
    held.touch(mode=0o644)
    os.chown(held, NOBODY, NOBODY)
    slot = HostSlots(theirs, 1).take("gpu0")
    assert slot is not None and HostSlots(theirs, 1).held("gpu0") == 1


def test_the_lock_folders_are_made_sticky_and_shared(own_lock_dir):
    from sweep.gpus.hostlock import lock_dir

    folder = lock_dir("host")
    assert [stat.S_IMODE(p.stat().st_mode) for p in (own_lock_dir, folder)] == [0o1777] * 2


def test_a_run_refuses_an_untrusted_lock_folder_in_one_line_before_storage(
        write_study, own_lock_dir, tmp_path):
    from sweep._core.errors import UsageError
    from sweep.commands.assembly import execute
    from sweep.spec import config
    from sweep.study.storage import find

    elsewhere = tmp_path / "theirs"
    elsewhere.mkdir()
    own_lock_dir.symlink_to(elsewhere)
    spec = config.load(write_study(study={"storage": f"sqlite:///{tmp_path}/s.db"}))
    with pytest.raises(UsageError, match=r"^the host's lock folder: .*locks is a symbolic "
                       r"link or not a folder: remove it, or set \$SWEEP_LOCK_DIR"), find(
                           spec) as found:
        execute(spec, [], found)
    assert not (tmp_path / "s.db").exists() and list(elsewhere.iterdir()) == []


def test_a_planted_lock_file_link_is_refused_in_one_line_before_anything_is_written(
        write_study, own_lock_dir, tmp_path, capsys):
    """Hostile pass item 3: `ln -s /victim $SWEEP_LOCK_DIR/<host>/sim0.0.lock` gave
    `UnsafePath: ... (run with --debug for the traceback)`, exit 1, to run and `sweep gpus`."""
    from sweep import cli
    from sweep._core.errors import UsageError
    from sweep.commands.assembly import execute
    from sweep.gpus.hostlock import LockFileError, lock_dir, usable_lock_dir
    from sweep.spec import config
    from sweep.study.ownership import host_name
    from sweep.study.storage import find

    folder = lock_dir(host_name())
    victim = tmp_path / "victim"
    (folder / "sim0.0.lock").symlink_to(victim)
    line = (f"the host's lock folder: {folder}/sim0.0.lock is a symbolic link: remove it, or "
            "set $SWEEP_LOCK_DIR to a folder of your own")
    with pytest.raises(LockFileError):
        lock_dir(host_name())
    with pytest.raises(UsageError) as refused:
        usable_lock_dir(host_name())
    assert str(refused.value) == line
    spec = config.load(write_study(study={"storage": f"sqlite:///{tmp_path}/s.db"}))
    with pytest.raises(UsageError) as refused, find(spec) as found:
        execute(spec, fake_devices("1"), found)
    assert str(refused.value) == line
    assert not (tmp_path / "s.db").exists() and not victim.exists()
    capsys.readouterr()
    assert cli.main(["gpus"]) == 2
    assert capsys.readouterr().err == f"sweep: error: {line}\n"
    assert not victim.exists()


def test_a_lock_file_found_unsafe_during_a_run_is_said_in_one_line(own_lock_dir, tmp_path):
    """A link planted after the run looked is a SweepError too: one line, no traceback."""
    from sweep._core.errors import SweepError
    from sweep.gpus.hostlock import lock_dir

    folder = lock_dir("host")
    (folder / "gpu0.mutex").symlink_to(tmp_path / "victim")
    with pytest.raises(SweepError) as refused:
        HostSlots(folder, 1).take("gpu0")
    assert str(refused.value) == (f"{folder}/gpu0.mutex is not a regular file (a symbolic "
                                  "link?): remove it, or set $SWEEP_LOCK_DIR to a folder of "
                                  "your own")
