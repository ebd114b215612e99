"""Stack dumps of a trial's Python processes with `py-spy dump`, into `<trial_dir>/stack.txt`.

py-spy reads the stacks of a running CPython from outside, without the trainer's cooperation;
it needs ptrace rights over the process (the same user with `kernel.yama.ptrace_scope` 0, or
root / CAP_SYS_PTRACE: in a container, `--cap-add SYS_PTRACE`). Without them, or without
py-spy, stack.txt says so for each process and the trial is stopped all the same.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import psutil

STACK_NAME = "stack.txt"
DUMP_SECONDS = 10.0  # the most one process's dump may take (processes are dumped at once)
NO_RIGHTS = ("py-spy needs ptrace rights over the trainer: the same user with "
             "kernel.yama.ptrace_scope 0, or root (in a container: --cap-add SYS_PTRACE)")

# (argv, timeout) -> (exit code, stdout, stderr); raises subprocess.TimeoutExpired
Runner = Callable[[list[str], float], tuple[int, str, str]]


def _run(argv: list[str], timeout: float) -> tuple[int, str, str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    return done.returncode, done.stdout, done.stderr


def py_spy() -> str | None:
    """The py-spy program: beside this interpreter (a virtualenv's bin), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def python_pids(pids: Iterable[int]) -> list[tuple[int, str]]:
    """Those of `pids` that run a Python interpreter, with their command lines, by pid."""
    out = []
    for pid in sorted(pids):
        try:
            proc = psutil.Process(pid)
            names = [proc.name(), *proc.cmdline()[:1]]
            line = " ".join(proc.cmdline()) or proc.name()
        except psutil.Error:
            continue
        if any("python" in Path(n).name for n in names):
            out.append((pid, line))
    return out


def dump(processes: list[tuple[int, str]], path: Path, why: str,
         find: Callable[[], str | None] = py_spy, run: Runner = _run,
         timeout: float = DUMP_SECONDS) -> str:
    """Dump the stacks of `processes` (pid, command line) into `path`, all at once, each
    within `timeout` s; returns what was written. Never raises for a process it cannot read:
    the file says why for each (no py-spy, no ptrace rights, gone, too slow)."""
    program = find()
    parts: dict[int, str] = {}

    def one(pid: int) -> None:
        if program is None:
            parts[pid] = "py-spy is not installed (pip install py-spy): no stack taken"
            return
        try:
            code, out, err = run([program, "dump", "--pid", str(pid)], timeout)
        except subprocess.TimeoutExpired:
            parts[pid] = f"py-spy did not finish within {timeout:g} s: no stack taken"
            return
        except OSError as e:
            parts[pid] = f"py-spy could not run: {e}"
            return
        if code == 0:
            parts[pid] = out.rstrip()
            return
        said = (err.strip() or out.strip()).splitlines()
        text = said_error(said) or f"exit code {code}"
        hint = f" ({NO_RIGHTS})" if any(w in "\n".join(said).lower() for w in (
            "permission", "not permitted", "ptrace")) else ""
        parts[pid] = f"py-spy could not read it: {text}{hint}"

    threads = [threading.Thread(target=one, args=(pid,), daemon=True) for pid, _ in processes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 1.0)
    lines = [f"# sweep: Python stacks of the trial's processes, taken before stopping it: {why}"]
    if not processes:
        lines.append("# no Python process of the trial was found running")
    for pid, command in processes:
        lines += ["", f"## pid {pid}: {command}",
                  parts.get(pid, f"py-spy did not finish within {timeout:g} s")]
    text = "\n".join(lines) + "\n"
    try:
        path.write_text(text)
    except OSError:
        pass  # a removed or full output_dir: the trial is stopped all the same
    return text


def said_error(lines: Sequence[str]) -> str | None:
    """What py-spy said went wrong: its `Error: ...` line (a backtrace may follow it), else
    its last line; None if it said nothing."""
    for line in lines:
        if line.strip().startswith("Error:"):
            return line.strip()
    return lines[-1].strip() if lines else None
