"""`launcher: warm`: trials forked from a server that has imported their modules are still
one process each, under their own guard, with their own stdio, exit code and environment;
a crash or a kill ends one fork; a server that cannot serve falls back to `direct`; what the
preload left in the server (atexit handlers, threads, signal dispositions) is not the forks'."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import ROOT, TRAINERS, processes_mentioning, run_cli, spawn_cli, wait_until

import sweep.launch._warm
import sweep.launch._warm_client
import sweep.launch.warm_server
import sweep.spec.schema
from sweep.launch._warm import WarmLauncher
from sweep.launch._warm_client import WarmServer, cannot_take, server_modules
from sweep.launch.make import make
from sweep.launch.warm_server import TESTED_PYTHONS, WarmError
from sweep.protocol import RESULT_ENV, TRIAL_DIR_ENV, TRIAL_NUMBER_ENV
from sweep.trial.launch_plan import LaunchPlan, TrialPaths
from sweep.trial.process import TrialProcess

PROBE = TRAINERS / "warm_probe.py"


# the tests of `server` run on one worker: its server imports torch (a few CPU-s) once for them
# all, not once on each worker that takes one of them
ON_THE_SERVER = pytest.mark.xdist_group("warm-server")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WarmServer]:
    """A server that preloads torch and decimal (a module a script's file may shadow)."""
    log = tmp_path_factory.mktemp("warm") / "warm.log"
    warm = WarmServer(["torch", "decimal"], {**os.environ, TRIAL_DIR_ENV: str(log.parent)},
                      log)
    hello = warm.ready(60)
    assert hello["failed"] == {} and hello["cuda"] is False
    yield warm
    warm.close()
    assert warm._popen.returncode == 0


def plan(tmp_path: Path, name: str, *args: str, script: Path = PROBE) -> LaunchPlan:
    paths = TrialPaths(tmp_path / name)
    paths.dir.mkdir()
    env = {TRIAL_DIR_ENV: str(paths.dir), TRIAL_NUMBER_ENV: name,
           RESULT_ENV: str(paths.result), "CUDA_VISIBLE_DEVICES": "3"}
    return LaunchPlan([sys.executable, str(script), *args], env, paths, paths.result)


def run(server: WarmServer, p: LaunchPlan, grace: float = 1.0) -> TrialProcess:
    proc = TrialProcess(p, grace, server=server)
    assert proc.wait(30)
    return proc


def record(p: LaunchPlan) -> dict:
    return json.loads((p.paths.dir / "probe.json").read_text())


@ON_THE_SERVER
def test_a_fork_is_its_own_process_under_its_own_guard(server, tmp_path):
    p = plan(tmp_path, "7", "--x", "0.25")
    proc = run(server, p)
    assert proc.exit_code == 0 and not proc.lost
    seen = record(p)
    assert seen["ppid"] == proc.pid  # the guard, in a session of its own
    assert seen["sid"] == proc.pid and seen["pgid"] == seen["pid"] != proc.pid
    assert seen["argv"] == [str(PROBE), "--x", "0.25"] and seen["name"] == "__main__"
    assert seen["path0"] == str(PROBE.parent) and seen["cwd"] == os.getcwd()
    assert seen["cvd"] == "3" and seen["stdin"] == ""
    assert seen["builtins_module"] == "module" and seen["orig_argv"] == [str(PROBE), "--x",
                                                                          "0.25"]
    assert p.paths.stdout.read_text() == "stdout of trial 7\n"
    assert p.paths.stderr.read_text() == "stderr of trial 7\n"
    assert json.loads(p.result.read_text()) == {"score": 0.25}
    assert not alive(seen["pid"])
    assert sorted(f.name for f in p.paths.dir.iterdir()) == [  # nothing of sweep's own
        "probe.json", "result.json", "stderr.log", "stdout.log"]


@pytest.mark.parametrize(("mode", "code", "said"), [
    ("exit3", 3, ""), ("exitneg", 247, ""), ("raise", 1, "RuntimeError: the trainer broke"),
    ("interrupt", 130, "KeyboardInterrupt"), ("term", 128 + signal.SIGTERM, ""),
])
@ON_THE_SERVER
def test_exit_codes_are_those_of_a_python_process(server, tmp_path, mode, code, said):
    p = plan(tmp_path, "1", "--mode", mode)
    assert run(server, p).exit_code == code
    fresh = subprocess.run([sys.executable, str(PROBE), "--mode", mode], env={
        **os.environ, **p.env}, capture_output=True, text=True, check=False)
    assert (fresh.returncode if fresh.returncode >= 0 else 128 - fresh.returncode) == code
    assert said in p.paths.stderr.read_text()
    if said:  # the traceback starts at the script, as python's does
        assert "warm_server.py" not in p.paths.stderr.read_text()


@ON_THE_SERVER
def test_forks_do_not_share_random_state(server, tmp_path):
    seen = [record(p) for p in [plan(tmp_path, str(i), "--mode", "seeds") for i in range(3)]
            if run(server, p).exit_code == 0]
    assert len({s["random"] for s in seen}) == 3
    assert len({s["numpy"] for s in seen}) == 3
    assert len({s["torch"] for s in seen}) == 3


@ON_THE_SERVER
def test_a_fork_takes_what_python_takes_from_its_environment(server, tmp_path):
    """PYTHONPATH, PYTHONIOENCODING, PYTHONFAULTHANDLER, TZ; and a file beside the script
    shadows a module the server had loaded, as in a new interpreter."""
    extra = tmp_path / "extra"
    extra.mkdir()
    script = tmp_path / "beside" / "probe.py"
    script.parent.mkdir()
    script.write_text(PROBE.read_text())
    (script.parent / "decimal.py").write_text("MINE = 1\n")
    p = plan(tmp_path, "8", "--mode", "env", script=script)
    env = {"PYTHONPATH": str(extra), "PYTHONIOENCODING": "latin-1",
           "PYTHONFAULTHANDLER": "1", "TZ": "Asia/Tokyo",
           "OMP_NUM_THREADS": str(len(os.sched_getaffinity(0)) + 1)}
    p = LaunchPlan(p.argv, {**p.env, **env}, p.paths, p.result)
    assert run(server, p).exit_code == 0, p.paths.stderr.read_text()
    seen = record(p)
    fresh = subprocess.run([sys.executable, str(script), "--mode", "env"], check=True,
                           env={**os.environ, **p.env})
    assert fresh.returncode == 0
    for key in ("encoding", "faulthandler", "tz", "local", "path1", "optimize", "threads"):
        assert seen[key] == record(p)[key]
    assert seen["encoding"] == "iso8859-1" and seen["faulthandler"] is True
    assert seen["tz"] == "JST" and seen["local"] == 1 and seen["path1"] == str(extra)


@ON_THE_SERVER
def test_files_left_open_and_an_excepthook_behave_as_in_python(server, tmp_path):
    script = tmp_path / "open.py"
    script.write_text(
        "import json, os, sys\n"
        "def save():\n"
        "    out = open(os.environ['SWEEP_RESULT_FILE'], 'w')  # never closed\n"
        "    json.dump({'score': 0.5}, out)\n"
        "    globals()['kept'] = out\n"
        "save()\n"
        "sys.excepthook = lambda *a: print('HOOKED', a[1], file=sys.stderr)\n"
        "raise ValueError('late')\n")
    p = plan(tmp_path, "9", script=script)
    assert run(server, p).exit_code == 1
    assert json.loads(p.result.read_text()) == {"score": 0.5}
    assert p.paths.stderr.read_text().strip() == "HOOKED late"


@ON_THE_SERVER
def test_a_guard_the_driver_never_heard_of_starts_nothing(server, tmp_path):
    """The driver lets a guard start its trainer only once it knows the guard's pid: a
    request whose answer never came (a timeout, a dying server) runs nothing."""
    p = plan(tmp_path, "10")
    control_r, control_w = os.pipe()
    status_r, status_w = os.pipe()
    with open(p.paths.stdout, "wb") as out, open(p.paths.stderr, "wb") as err:
        pid = server.fork(p.argv, {**os.environ, **p.env}, os.getcwd(), 1.0, str(p.paths.dir),
                          (control_r, status_w, out.fileno(), err.fileno()))
    for fd in (control_r, status_w, control_w):  # as the driver does when it gives up
        os.close(fd)
    with os.fdopen(status_r, "rb") as status:
        assert status.read() == b""  # the guard ended without a word
    assert wait_until(lambda: not psutil.pid_exists(pid), 5)
    assert not (p.paths.dir / "probe.json").exists()


@pytest.mark.parametrize("poison", ["is_initialized", "_is_in_bad_fork"])
def test_a_preload_that_made_cuda_unusable_in_forks_is_reported(tmp_path, monkeypatch, poison):
    """CUDA initialised, or only asked a device count (which torch marks as spoiling forks):
    the server says so, and the driver starts trials as direct."""
    (tmp_path / "spoils.py").write_text(f"import torch\ntorch.cuda.{poison} = lambda: True\n")
    env = {**os.environ, TRIAL_DIR_ENV: str(tmp_path), "PYTHONPATH": str(tmp_path)}
    warm = WarmServer(["torch", "spoils"], env, tmp_path / "warm.log")
    try:
        assert warm.ready(60)["cuda"] is True
    finally:
        warm.close()


def module(tmp_path: Path, name: str, text: str) -> None:
    """A module for a server to preload, in `tmp_path/mods` (not beside a trial's script,
    which would shadow it: the fork would import it afresh)."""
    (tmp_path / "mods").mkdir(exist_ok=True)
    (tmp_path / "mods" / f"{name}.py").write_text(text)


def own_server(tmp_path: Path, preload: list[str], **kw) -> WarmServer:
    """A server with `tmp_path/mods` on its PYTHONPATH."""
    env = {**os.environ, TRIAL_DIR_ENV: str(tmp_path), "PYTHONPATH": str(tmp_path / "mods")}
    return WarmServer(preload, env, tmp_path / "warm.log", **kw)


def test_a_preloads_atexit_handlers_are_the_servers_not_each_forks(tmp_path):
    """Issue 26 item 11: a module that makes a temporary folder at import and removes it at
    exit (as matplotlib does): every fork finds the folder, however many ended before it."""
    module(tmp_path, "tmpdir_at_import",
        "import atexit, shutil, tempfile\n"
        "DIR = tempfile.mkdtemp()\n"
        "atexit.register(shutil.rmtree, DIR, True)\n")
    script = tmp_path / "uses.py"
    script.write_text(
        "import atexit, json, os, sys, tmpdir_at_import\n"
        "assert os.path.isdir(tmpdir_at_import.DIR), 'the folder is gone'\n"
        "atexit.register(lambda: open(os.environ['SWEEP_RESULT_FILE'], 'w').write("
        "json.dumps({'score': 1})))\n")  # the script's own handlers do run
    warm = own_server(tmp_path, ["tmpdir_at_import"])
    try:
        assert warm.ready(60)["failed"] == {}
        codes = []
        for i in range(3):
            p = plan(tmp_path, f"a{i}", script=script)
            codes.append(run(warm, p).exit_code)
            assert json.loads(p.result.read_text()) == {"score": 1}, p.paths.stderr.read_text()
    finally:
        warm.close()
    assert codes == [0, 0, 0]


def test_a_preload_that_leaves_a_thread_running_is_refused_and_trials_start_as_direct(
        tmp_path, monkeypatch):
    """Issue 26 item 11: a thread started at import that holds a lock deadlocked every fork.
    The server names the threads; the launcher falls back to direct and says why, once."""
    module(tmp_path, "holds_lock",
        "import threading, time\n"
        "LOCK = threading.Lock()\n"
        "def hold():\n"
        "    while True:\n"
        "        with LOCK:\n"
        "            time.sleep(0.01)\n"
        "threading.Thread(target=hold, name='holder', daemon=True).start()\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "mods"))
    warm = own_server(tmp_path, ["holds_lock"])
    try:
        assert warm.ready(60)["threads"] == ["holder"]
    finally:
        warm.close()
    spec = sweep.spec.schema.Spec.model_validate({
        "study": {"name": "t", "metric": "score", "n_trials": 1, "output_dir": str(tmp_path)},
        "trainer": {"script": str(PROBE), "launcher": "warm", "preload": ["holds_lock"]},
        "params": {"x": {"type": "float", "low": 0, "high": 1}}})
    said: list[str] = []
    (tmp_path / "own").mkdir()
    launcher = make(spec, "h", tmp_path / "own", said.append)
    try:
        assert isinstance(launcher, WarmLauncher) and launcher.server is not None
        launcher.get_ready()
        assert launcher.server is None
        assert said == ["launcher: warm: importing the preloaded modules left threads running "
                        "(holder): a fork would find their locks held forever; starting "
                        "trials as launcher: direct"]
    finally:
        launcher.close()


def test_a_preload_that_ignores_sigchld_neither_breaks_the_server_nor_changes_the_trainer(
        tmp_path):
    """Issue 26 item 11: SIGCHLD set to SIG_IGN at import made the server's own wait fail
    (ChildProcessError) and the fallback say "exit None". The server and its guards wait
    with the default; the trainer has the preload's disposition, as a script that imported
    the module in a new interpreter would."""
    module(tmp_path, "ignores_sigchld",
           "import signal\nsignal.signal(signal.SIGCHLD, signal.SIG_IGN)\n")
    script = tmp_path / "child.py"
    script.write_text(
        "import json, os, signal, subprocess, sys, ignores_sigchld\n"
        "subprocess.run([sys.executable, '-c', 'pass'])\n"
        "json.dump({'score': signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN},"
        " open(os.environ['SWEEP_RESULT_FILE'], 'w'))\n")
    warm = own_server(tmp_path, ["torch", "ignores_sigchld"])  # torch: the check for CUDA
    try:
        hello = warm.ready(60)
        assert hello["failed"] == {} and hello["cuda"] is False
        assert hello["threads"] == []
        p = plan(tmp_path, "c", script=script)
        proc = run(warm, p)
        assert proc.exit_code == 0 and not proc.lost, p.paths.stderr.read_text()
        assert json.loads(p.result.read_text()) == {"score": True}
    finally:
        warm.close()
    assert warm._popen.returncode == 0


@pytest.mark.parametrize(("ending", "said"), [
    ("os._exit(3)", "the server ended while importing (exit 3; see "),
    ("os.kill(os.getpid(), 9)", "the server ended while importing (killed by signal 9; see "),
])
def test_a_server_that_dies_while_importing_says_how(tmp_path, ending, said):
    """Never "exit None": the server has closed its socket, so its end is waited for."""
    module(tmp_path, "dies", f"import os\n{ending}\n")
    warm = own_server(tmp_path, ["dies"])
    try:
        with pytest.raises(WarmError) as raised:
            warm.ready(60)
    finally:
        warm.close()
    assert str(raised.value).startswith(said)


def claimed_pythons() -> list:
    """An interpreter for each Python `warm` claims (TESTED_PYTHONS): this one, and those
    pyenv or the system has; one not found here is a visible skip."""
    found = []
    for major, minor in TESTED_PYTHONS:
        here = [sys.executable] if sys.version_info[:2] == (major, minor) else []
        candidates = [*here, *sorted(Path("/root/.pyenv/versions").glob(
            f"{major}.{minor}.*/bin/python")), Path(f"/usr/bin/python{major}.{minor}")]
        python = next((str(c) for c in candidates if os.access(c, os.X_OK)), None)
        found.append(pytest.param(python, id=f"{major}.{minor}", marks=[] if python else
                                  pytest.mark.skip(reason=f"no Python {major}.{minor} here")))
    return found


@pytest.mark.parametrize("python", claimed_pythons())
def test_the_interpreter_imitation_holds_on_every_python_warm_claims(tmp_path, python):
    """On each claimed Python, a fork's argv, __main__, exit code (exit, raise, Ctrl-C,
    SIGTERM), stdio and the script's atexit handlers behave as `python script.py` of that
    interpreter; a preloaded module's atexit handler runs in no fork."""
    module(tmp_path, "atexit_at_import",
           "import atexit, os\natexit.register(lambda: os.write(2, b'SERVER HANDLER\\n'))\n")
    script = tmp_path / "imitated.py"
    script.write_text(
        "import atexit, json, os, signal, sys, atexit_at_import\n"
        "atexit.register(lambda: print('bye', flush=True))\n"
        "print(json.dumps({'argv': sys.argv, 'name': __name__, 'path0': sys.path[0],"
        " 'version': list(sys.version_info[:2])}))\n"
        "mode = sys.argv[1]\n"
        "if mode == 'exit3': sys.exit(3)\n"
        "if mode == 'raise': raise RuntimeError('broke')\n"
        "if mode == 'interrupt': raise KeyboardInterrupt\n"
        "if mode == 'term': os.kill(os.getpid(), signal.SIGTERM)\n")
    env = {**os.environ, TRIAL_DIR_ENV: str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(tmp_path / "mods"), str(ROOT)])}
    warm = WarmServer(["atexit_at_import"], env, tmp_path / "warm.log", python=python)
    try:
        assert warm.ready(60)["failed"] == {}, (tmp_path / "warm.log").read_text()
        for mode in ("ok", "exit3", "raise", "interrupt", "term"):
            p = plan(tmp_path, mode, mode, script=script)
            p = LaunchPlan([python, *p.argv[1:]], {**p.env, "PYTHONPATH": env["PYTHONPATH"]},
                           p.paths, p.result)
            proc = TrialProcess(p, 1.0, server=warm)
            assert proc.wait(30)
            fresh = subprocess.run([python, str(script), mode], capture_output=True, text=True,
                                   env={**os.environ, **p.env}, check=False)
            code = fresh.returncode if fresh.returncode >= 0 else 128 - fresh.returncode
            out, err = p.paths.stdout.read_text(), p.paths.stderr.read_text()
            assert (proc.exit_code, out) == (code, fresh.stdout), (mode, err)
            assert json.loads(out.splitlines()[0])["version"] == list(
                json.loads(fresh.stdout.splitlines()[0])["version"])
            # the one documented difference: a preloaded module's atexit handler is the
            # server's (a new interpreter that imports the module runs it at exit)
            theirs = fresh.stderr.replace("SERVER HANDLER\n", "")
            assert "SERVER HANDLER" not in err
            assert fresh.stderr.count("SERVER HANDLER") == (mode != "term")
            assert err.splitlines()[-1:] == theirs.splitlines()[-1:]
    finally:
        warm.close()


def test_warm_on_a_python_it_was_not_tested_on_starts_trials_as_direct(tmp_path):
    spec = sweep.spec.schema.Spec.model_validate({
        "study": {"name": "t", "metric": "score", "n_trials": 1, "output_dir": str(tmp_path)},
        "trainer": {"script": str(PROBE), "launcher": "warm"},
        "params": {"x": {"type": "float", "low": 0, "high": 1}}})
    said: list[str] = []
    launcher = WarmLauncher(spec, "h", tmp_path, said.append, lambda: False,
                                      python=(3, 99))
    assert launcher.server is None
    assert said == ["launcher: warm: its fork server imitates a new interpreter of Python "
                    "3.10, 3.11, 3.12, 3.13, and this is 3.99; starting trials as launcher: "
                    "direct"]


def test_what_a_fork_cannot_take_is_named(tmp_path):
    assert cannot_take({"PYTHONOPTIMIZE": "1", "PYTHONPATH": "/x", "TZ": "UTC",
                        "PYTHONWARNINGS": "error", "PYTHONHASHSEED": "0", "LC_ALL": "C",
                        "LANG": "C.UTF-8"},
                       {"PYTHONHASHSEED": "0", "LANG": "C.UTF-8"}) == [
        "LC_ALL", "PYTHONOPTIMIZE", "PYTHONWARNINGS"]
    # a folder the trial adds to PYTHONPATH with a sitecustomize that python would run
    (tmp_path / "sitecustomize.py").write_text("print('hello')\n")
    (tmp_path / "pkg" / "usercustomize").mkdir(parents=True)
    (tmp_path / "pkg" / "usercustomize" / "__init__.py").write_text("")
    for folder in (tmp_path, tmp_path / "pkg"):
        assert cannot_take({"PYTHONPATH": f"/x:{folder}"}, {}) == ["PYTHONPATH"]
        assert cannot_take({"PYTHONPATH": f"/x:{folder}"}, {"PYTHONPATH": str(folder)}) == []
    assert cannot_take({"PYTHONPATH": f"{tmp_path / 'none'}"}, {}) == []


@ON_THE_SERVER
def test_a_stop_ends_the_fork_and_what_it_started(server, tmp_path):
    script = tmp_path / "hide.py"
    script.write_text(
        "import os, signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'], "
        "start_new_session=True)\n"
        "open(os.path.join(os.environ['SWEEP_TRIAL_DIR'], 'child.pid'), 'w').write("
        "str(child.pid))\n"
        "time.sleep(60)\n")
    p = plan(tmp_path, "2", script=script)
    proc = TrialProcess(p, 0.5, server=server)
    child = p.paths.dir / "child.pid"
    assert wait_until(lambda: child.exists() and child.read_text(), 20)
    pids = proc.tree_pids()
    assert int(child.read_text()) in pids and len(pids) == 3
    trainer = fork_of(proc)
    proc.stop()
    assert proc.wait(10)
    assert proc.exit_code == 128 + signal.SIGKILL  # it ignored SIGTERM for its grace period
    hidden = int(child.read_text())
    assert not alive(trainer) and not alive(hidden)  # gone when the trial is said to have ended
    assert wait_until(lambda: not any(alive(pid) for pid in pids), 5)  # the guard just after


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def fork_of(proc: TrialProcess) -> int:
    """The trainer of a warm trial: its guard's one child, once it runs."""
    assert wait_until(lambda: len(psutil.Process(proc.pid).children()) == 1, 10)
    return psutil.Process(proc.pid).children()[0].pid


def sleeping(server: WarmServer, tmp_path: Path, name: str,
             grace: float = 5.0) -> tuple[TrialProcess, int]:
    """A trial that sleeps a minute, and its trainer's pid once it runs."""
    script = tmp_path / "sleep.py"
    script.write_text("import os, time\n"
                      "open(os.path.join(os.environ['SWEEP_TRIAL_DIR'], 'up'), 'w').close()\n"
                      "time.sleep(60)\n")
    p = plan(tmp_path, name, script=script)
    proc = TrialProcess(p, grace, server=server)
    assert wait_until((p.paths.dir / "up").exists, 10)
    return proc, fork_of(proc)


@ON_THE_SERVER
def test_a_killed_guard_leaves_nothing_behind(server, tmp_path):
    """SIGKILL the guard (the trainer may do it): the trial is lost, its fork is killed."""
    proc, trainer = sleeping(server, tmp_path, "3")
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(10)
    assert proc.lost and proc.exit_code == 128 + signal.SIGKILL
    assert wait_until(lambda: not psutil.pid_exists(trainer) or psutil.Process(
        trainer).status() == psutil.STATUS_ZOMBIE, 5)


def test_a_fork_dies_with_its_guard_even_when_its_server_is_gone(tmp_path):
    """Server and guard SIGKILLed (no one left to find the fork: its /proc environment is
    the server's, and no file names it): the fork dies with its guard."""
    warm = WarmServer([], {**os.environ, TRIAL_DIR_ENV: str(tmp_path)}, tmp_path / "warm.log")
    try:
        warm.ready(30)
        proc, trainer = sleeping(warm, tmp_path, "6")
        os.kill(warm._popen.pid, signal.SIGKILL)
        warm._popen.wait()
        os.kill(proc.pid, signal.SIGKILL)
        assert wait_until(lambda: not alive(trainer), 5)
        assert proc.wait(10)
    finally:
        warm.close()


@ON_THE_SERVER
def test_a_force_kill_from_the_driver_ends_the_fork_with_its_guard(server, tmp_path):
    """The driver knows a warm trial by its guard's pid alone (no file in the trial folder):
    SIGKILL to the guard's group takes the fork with it (it dies with its guard)."""
    proc, trainer = sleeping(server, tmp_path, "4")
    proc.force_kill()
    assert proc.wait(10) and proc.exit_code == 128 + signal.SIGKILL
    assert wait_until(lambda: not alive(trainer), 5)


def test_a_server_that_does_not_answer_holds_the_driver_briefly_and_starts_nothing(
        tmp_path, monkeypatch):
    """A stopped server: a start gives up after FORK_PATIENCE s, or at once when the driver
    is asked to stop; the guard the server forks once it runs again starts nothing."""
    stopping = threading.Event()
    for name, patience, why in (("patience", 1.0, "no answer in 1 s"),
                                ("signal", 6.0, "the run is stopping")):
        monkeypatch.setattr(sweep.launch._warm_client, "FORK_PATIENCE", patience)
        warm = WarmServer([], {**os.environ, TRIAL_DIR_ENV: str(tmp_path)},
                          tmp_path / f"{name}.log", abort=stopping.is_set)
        warm.ready(30)
        os.kill(warm._popen.pid, signal.SIGSTOP)
        p = plan(tmp_path, name)
        began = time.monotonic()
        if name == "signal":
            threading.Timer(0.3, stopping.set).start()
        with pytest.raises(sweep.launch.warm_server.WarmError, match=why):
            TrialProcess(p, 1.0, server=warm)
        took = time.monotonic() - began
        assert took < 3.0
        os.kill(warm._popen.pid, signal.SIGCONT)
        time.sleep(0.5)  # it forks the guard now, which hears no GO
        assert not (p.paths.dir / "probe.json").exists()
        warm.close()
        assert warm._popen.returncode == 0


def test_the_server_ends_when_the_driver_does(tmp_path):
    """The driver's end of the socket closes (even by SIGKILL): the server stops serving,
    its running trials are stopped by their guards, and it exits."""
    log = tmp_path / "warm.log"
    warm = WarmServer([], {**os.environ, TRIAL_DIR_ENV: str(tmp_path)}, log)
    warm.ready(30)
    proc, trainer = sleeping(warm, tmp_path, "5", grace=0.5)
    proc.close()  # as the driver's death would: the control pipe and the socket close
    warm._sock.close()
    assert warm._popen.wait(10) == 0
    assert not psutil.pid_exists(trainer)


def test_what_a_run_preloads_is_torch_accelerate_then_its_own():
    assert server_modules(["transformers", "torch"]) == ["torch", "accelerate", "transformers"]
    assert server_modules([]) == ["torch", "accelerate"]


# ---- through the driver ------------------------------------------------------------------


def test_a_warm_study_runs_crashes_alone_and_says_where_it_fell_back(write_study, tmp_path,
                                                                     monkeypatch, capsys):
    """Trials of one study on 2 devices: a crash fails only its trial; a module that cannot
    be preloaded is named; a preload that initialises CUDA falls back to `direct`. (The
    drivers run in this process: what is warm is their trials'.)"""
    (tmp_path / "cuda_at_import.py").write_text(
        "import torch\ntorch.cuda.is_initialized = lambda: True\n")
    modes = ["ok", "raise", "ok", "exit3", "ok", "ok"]
    out = {}
    for name, preload in (("warm", ["no_such_module_x"]), ("fallback", ["cuda_at_import"])):
        study = write_study(
            study={"name": name, "n_trials": modes.count("ok"),  # failures do not count
                   "enqueue": [{"mode": m, "x": i / 10} for i, m in enumerate(modes)]},
            trainer={"script": str(PROBE), "launcher": "warm", "preload": preload},
            params={"mode": {"type": "categorical", "choices": ["ok", "raise", "exit3"]},
                    "x": {"type": "float", "low": 0, "high": 1}},
            name=f"{name}.yaml")
        monkeypatch.setenv("SWEEP_FAKE_GPUS", "2")
        monkeypatch.setenv("PYTHONPATH", str(tmp_path))
        code = run_cli("run", str(study))
        out[name] = capsys.readouterr().err
        assert code == 0, out[name]
        seen = {int(t.name): json.loads((t / "probe.json").read_text())
                for t in (tmp_path / name / "trials").glob("[0-9]*")}
        assert len(seen) >= len(modes)  # a random trial may start beside the last queued
        assert {s["cvd"] for s in seen.values()} == {"0", "1"}
        assert all(s["torch_loaded_at_start"] is (name == "warm") for s in seen.values())
        trials = sweep.load(str(study)).trials.set_index("number")
        assert [trials.loc[n, "state"] for n in range(len(modes))] == [
            "FAIL" if m != "ok" else "COMPLETE" for m in modes]
    assert "could not preload no_such_module_x (ModuleNotFoundError" in out["warm"]
    assert "initialised CUDA" in out["fallback"] and "as launcher: direct" in out["fallback"]
    assert "as launcher: direct" not in out["warm"]


def test_a_killed_driver_leaves_no_fork_behind(write_study, tmp_path):
    study = write_study(
        study={"name": "k", "n_trials": 4},
        trainer={"script": str(TRAINERS / "probe.py"), "launcher": "warm",
                 "args": ["--sleep", "60"]},
        params={"x": {"type": "float", "low": 0, "high": 1}})
    run = spawn_cli("run", str(study), env={"SWEEP_FAKE_GPUS": "2"})
    forks = lambda: [p for p in processes_mentioning(str(tmp_path))  # noqa: E731
                     if "sweep.launch.warm_server" in (p.info["cmdline"] or [])]  # read as listed:
    # a process that ended since has no command line to ask for
    # every=0.5: each look reads every process's environment (a core's worth at 0.05)
    assert wait_until(lambda: len(forks()) == 5, 60, every=0.5)  # the server, 2 guards, 2 trainers
    run.send_signal(signal.SIGKILL)
    run.wait()
    deadline = time.monotonic() + 15
    while processes_mentioning(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_mentioning(str(tmp_path)) == []


def test_a_slow_preload_or_a_setting_a_fork_cannot_take_starts_trials_as_direct(
        write_study, tmp_path, monkeypatch, capsys):
    """Trials do not wait for a server that is still importing: they start as `direct` until
    it is ready, then as its forks. A trainer.env that sets PYTHONOPTIMIZE starts as
    `direct`. The user is told each once."""
    gate = tmp_path / "gate"  # the import ends once the first trial ran (as direct)
    (tmp_path / "slow_import.py").write_text(
        f"import os, time\nwhile not os.path.exists({str(gate)!r}):\n    time.sleep(0.02)\n")
    first = tmp_path / "slow" / "trials" / "0" / "probe.json"

    def open_gate() -> None:
        wait_until(first.exists, 120)
        gate.touch()

    opener = threading.Thread(target=open_gate, daemon=True)
    opener.start()
    patience = sweep.launch._warm.WARM_WAIT
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("SWEEP_FAKE_GPUS", "1")
    seen = {}
    for name, trainer in (("slow", {"preload": ["slow_import"]}),
                          ("optimize", {"env": {"PYTHONOPTIMIZE": "1"}})):
        # "optimize" waits for its server as a run does, so that a ready one refuses the trial
        monkeypatch.setattr(sweep.launch._warm, "WARM_WAIT", 0.3 if name == "slow" else patience)
        study = write_study(
            study={"name": name, "n_trials": 8 if name == "slow" else 2},
            trainer={"script": str(PROBE), "launcher": "warm", "args": ["--sleep", "0.5"],
                     **trainer},
            params={"x": {"type": "float", "low": 0, "high": 1}}, name=f"{name}.yaml")
        assert run_cli("run", str(study)) == 0
        seen[name] = capsys.readouterr().err
        forked = [json.loads((t / "probe.json").read_text())["torch_loaded_at_start"]
                  for t in sorted((tmp_path / name / "trials").glob("[0-9]*"),
                                  key=lambda t: int(t.name))]
        if name == "slow":
            assert forked[0] is False and forked[-1] is True, forked
            assert forked == sorted(forked)  # direct until the server was ready, then forks
        else:
            assert forked == [False, False]
    assert seen["slow"].count("still importing") == 1 and "server is ready" in seen["slow"]
    assert seen["optimize"].count("trainer.env sets PYTHONOPTIMIZE") == 1
