"""The interpreter probe: which distributions provide a script's modules; nothing of it
outlives a stop signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from importlib import metadata
from typing import Any

import pytest
from conftest import assert_gone

from sweep._core import stops
from sweep.spec import interpreter

# a module of its distribution's name (torch, numpy), one of another name (yaml: PyYAML), a
# single-file module (typing_extensions.py), a namespace package (google, from protobuf), an
# editable install (sweep), and one nothing provides
MODULES = ["torch", "numpy", "yaml", "typing_extensions", "google", "sweep", "no_such_module"]


def test_the_distributions_named_are_those_the_full_scan_finds():
    """The probe takes the distribution of the module's own name when its files hold the
    module, and scans every distribution otherwise: the answer is the scan's."""
    found = interpreter.probe(sys.executable, modules=MODULES).modules
    scan = metadata.packages_distributions()
    expected = {dist: metadata.version(dist) for module in MODULES
                for dist in scan.get(module, [])}
    assert found == expected
    assert {"torch", "numpy", "PyYAML", "typing_extensions", "sweep"} <= set(found)


def test_a_stop_signal_while_the_probe_starts_leaves_nothing_of_it_running(tmp_path, monkeypatch):
    """SIGTERM while Python's Popen waits for the probe's exec (the window forced: the signal
    comes inside the call, after the child started): the probe ends with KeyboardInterrupt,
    as a stop does, and the probe's whole group is killed, its child (`sleep 300`) too.
    Before, Popen gave up the child's pid to the interruption and the probe ran on."""
    pid_file = tmp_path / "child.pid"
    hang = tmp_path / "hang"
    hang.write_text(f"#!/bin/bash\nsleep 300 &\necho $! > {pid_file}\nwait\n")
    hang.chmod(0o755)
    real = subprocess.Popen

    def interrupted(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        proc = real(*args, **kwargs)
        for _ in range(500):  # the child and its own child run
            if pid_file.exists() and pid_file.read_text().strip():
                break
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)  # its handler runs before this returns
        for _ in range(100):
            time.sleep(0.001)
        return proc

    monkeypatch.setattr(interpreter.subprocess, "Popen", interrupted)
    before = {s: signal.getsignal(s) for s in stops.STOPS}
    stops.catch()
    try:
        with pytest.raises(KeyboardInterrupt):
            interpreter.probe(str(hang))
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    assert_gone(int(pid_file.read_text()), "the probe's child outlived the interrupted probe")


def test_a_stop_signal_inside_deferred_comes_once_at_its_end():
    """`stops.deferred`: a stop signal inside the block is raised as KeyboardInterrupt at its
    end (the outermost one, when nested), once; outside, at once."""
    before = {s: signal.getsignal(s) for s in stops.STOPS}
    stops.catch()
    reached = []
    try:
        with pytest.raises(KeyboardInterrupt), stops.deferred():
            with stops.deferred():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.01)
                reached.append("inner")
            reached.append("outer")
        with stops.deferred():  # nothing came: nothing raised
            reached.append("quiet")
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    assert reached == ["inner", "outer", "quiet"]


def test_a_stop_inside_deferred_wins_over_the_error_the_block_raises(monkeypatch):
    """A stop signal while the probe starts, then an error leaving the block (an interpreter
    that cannot be run): the stop is raised there, not kept to be raised by a later block
    (found by a hostile review: a later, healthy probe raised it)."""
    monkeypatch.setattr(stops, "STATE", stops.State())
    with pytest.raises(KeyboardInterrupt), stops.deferred():
        stops.interrupt(signal.SIGTERM, None)  # as the handler runs when the signal comes
        raise OSError("cannot run it")
    assert stops.STATE.deferred is None
    with stops.deferred():  # nothing is left over for a later block
        pass


def test_deferred_in_another_thread_leaves_the_main_threads_stops_alone(monkeypatch):
    """Signal handlers run in the main thread: a block in another thread defers nothing, so
    a stop that comes meanwhile is the main thread's at once."""
    monkeypatch.setattr(stops, "STATE", stops.State())
    inside, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with stops.deferred():
            inside.set()
            leave.wait(5)

    worker = threading.Thread(target=hold)
    worker.start()
    try:
        assert inside.wait(5)
        with pytest.raises(KeyboardInterrupt):
            stops.interrupt(signal.SIGTERM, None)
    finally:
        leave.set()
        worker.join(5)
    assert stops.STATE.deferred is None
