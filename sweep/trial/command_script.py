"""A trial's command.sh: its exact command as a shell script, to rerun it by hand, with no
secret in it. The values of variables whose names look secret or that hold a URL's password
are left out (the script takes them from its caller's environment, and says so), and a URL's
password in an argument is written as `***`."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Protocol

from sweep._core import secrets

SHORTEST_SECRET = secrets.SHORTEST  # shorter secret values are not looked for in arguments
secret_name, holds_password = secrets.secret_name, secrets.holds_password
secret_variable = secrets.secret_variable  # what command.sh leaves out (sweep._core.secrets)


def arg_secrets(args: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of `environ` that `trainer.args` expand (`$NAME`, `${NAME}`) and whose
    names look secret, or whose values hold a URL's password or a secret by its form: their
    values are left out of command.sh."""
    names = {m.group(1) or m.group(2) for a in args for m in _VARIABLE.finditer(a)}
    return {n: environ[n] for n in sorted(names)
            if n in environ and secret_variable(n, environ[n])}


_VARIABLE = re.compile(r"\$\{([A-Za-z_]\w*)\}|\$([A-Za-z_]\w*)")


class Command(Protocol):
    """What command.sh is made of: a `launch_plan.LaunchPlan` (and its `cwd`, if it has one)."""

    @property
    def argv(self) -> list[str]: ...
    @property
    def env(self) -> dict[str, str]: ...


def command_script(plan: Command, secrets: Mapping[str, str]) -> str:
    """command.sh: the trial's exact command as a shell script, except that the values of
    the trial's variables whose names look secret or whose values hold a URL's password, and
    of `secrets` in its arguments, are left out: the script takes them from its caller's
    environment, and says so. A URL's password in an argument that no such variable holds
    is written as `***`: the script says so, and runs only once it is put back."""
    left = {k for k, v in plan.env.items() if secret_variable(k, v)}
    hidden = {**secrets, **{k: plan.env[k] for k in left}}
    values = sorted(((v, k) for k, v in hidden.items() if len(v) >= SHORTEST_SECRET),
                    key=lambda vk: -len(vk[0]))
    in_args: set[str] = set()
    starred: list[str] = []
    words = [_quote(arg, values, in_args, starred) for arg in plan.argv]
    env = " ".join(f"{k}={_ref(k) if k in left else shlex.quote(v)}"
                   for k, v in sorted(plan.env.items()))
    lines = ["#!/bin/sh"]
    names = {*left, *in_args}
    named = sorted(n for n in names if secret_name(n))
    if named:
        lines.append(f"# left out (their names look secret): {', '.join(named)}; set "
                     "them in your environment to run this (they come from trainer.env "
                     "or the driver's environment)")
    urls = sorted(n for n in names - set(named) if holds_password(hidden[n]))
    if urls:
        lines.append(f"# left out (their values hold a password in a URL): {', '.join(urls)}; "
                     "set them in your environment to run this (they come from trainer.env "
                     "or the driver's environment)")
    forms = sorted(names - set(named) - set(urls))
    if forms:
        lines.append(f"# left out (their values are secrets by their form: a token, a "
                     f"webhook, a key): {', '.join(forms)}; set them in your environment to "
                     "run this (they come from trainer.env or the driver's environment)")
    if starred:
        lines.append("# a password in a URL or a secret (a token, a webhook, a key) in the "
                     "arguments is written as ***: put it back (edit this file) to run this")
    cwd = getattr(plan, "cwd", None)  # `trainer.workdir`: the trial runs there
    if cwd is not None:
        lines.append(f"cd {shlex.quote(str(cwd))} || exit 1")
    lines.append(f"{env} {' '.join(words)}")
    return "\n".join(lines) + "\n"


def _ref(name: str) -> str:
    return f'"${{{name}:?is left out of command.sh: set it}}"'


def _quote(arg: str, values: list[tuple[str, str]], found: set[str],
           starred: list[str]) -> str:
    """`arg` as one shell word, each secret value in it replaced by a reference to its
    variable, and each URL's password left in it by `***` (noted in `starred`)."""
    for value, name in values:
        if value in arg:
            found.add(name)
            return _ref(name).join(_quote(part, values, found, starred) if part else ""
                                   for part in arg.split(value))
    if secrets.secret_value(arg):
        starred.append(arg)
        arg = secrets.starred(arg)
    return shlex.quote(arg)
