"""`trainer.container.run_args` read as the engine reads them, pure.

`options` splits the list into the options the engine sees: `--name=value`, `--name value`,
and short flags combined in one argument (`-itd` is `-i -t -d`; in `-vHOST:T` and `-w/x` the
rest of the argument is the value of the flag that takes one), as podman and docker (their
pflag parser) and apptainer read them. `own` says why an option is one sweep sets for each
trial itself; `mounts` lists the targets of the mounts an option adds (`-v`, `--volume`,
`--mount`, `--tmpfs`; `-B`, `--bind`, `--mount` for apptainer), which the study file's check
compares with sweep's own mounts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# podman's and docker's one-letter flags (`podman run --help`), by their long names
SHORT = {"a": "--attach", "c": "--cpu-shares", "d": "--detach", "e": "--env",
         "h": "--hostname", "i": "--interactive", "l": "--label", "m": "--memory",
         "P": "--publish-all", "p": "--publish", "q": "--quiet", "t": "--tty", "u": "--user",
         "v": "--volume", "w": "--workdir"}
# their options that take a value: the next argument is that value, never an option
TAKES_VALUE = frozenset({
    "--add-host", "--annotation", "--arch", "--attach", "--cap-add", "--cap-drop",
    "--cgroup-parent", "--cgroupns", "--cidfile", "--cpu-shares", "--cpus", "--cpuset-cpus",
    "--cpuset-mems", "--device", "--dns", "--entrypoint", "--env", "--env-file", "--gpus",
    "--group-add", "--health-cmd", "--hostname", "--init-path", "--ipc", "--label",
    "--log-driver", "--log-opt", "--memory", "--mount", "--name", "--network", "--net",
    "--os", "--pid", "--platform", "--pod", "--publish", "--pull", "--restart", "--runtime",
    "--secret", "--security-opt", "--shm-size", "--stop-signal", "--stop-timeout",
    "--sysctl", "--timeout", "--tmpfs", "--ulimit", "--user", "--userns", "--uts",
    "--variant", "--volume", "--volumes-from", "--workdir"})
# apptainer's (`apptainer exec --help`): its own letters (-w is --writable, -e --cleanenv)
APPTAINER_SHORT = {"B": "--bind", "c": "--contain", "C": "--containall", "e": "--cleanenv",
                   "f": "--fakeroot", "H": "--home", "i": "--ipc", "o": "--overlay",
                   "p": "--pid", "S": "--scratch", "u": "--userns", "W": "--workdir",
                   "w": "--writable"}
APPTAINER_TAKES_VALUE = frozenset({
    "--app", "--bind", "--dns", "--env", "--env-file", "--home", "--hostname", "--mount",
    "--network", "--network-args", "--overlay", "--pwd", "--scratch", "--security",
    "--workdir"})

# what sweep sets for each trial, and why a study may not set it too
OWN = {
    "--name": "each trial's container is named sweep-<study>-<trial>",
    "--rm": "each trial's container is removed when it ends",
    "--detach": "a trial's container runs in the foreground, its exit the trial's",
    "--tty": "a trial has no terminal, its output and errors read apart",
    "--interactive": "a trial reads no input",
    "--restart": "a trial runs again only as trainer.max_retries says",
    "--workdir": "the working folder is trainer.workdir's to set",
    "--gpus": "each trial gets the devices it leased",
}
APPTAINER_OWN = {"--pwd": OWN["--workdir"]}
# what picks the devices a trial sees: sweep sets them to the devices each trial leased
DEVICE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
GPU_DEVICES = ("nvidia.com/gpu", "/dev/nvidia")


@dataclass(frozen=True)
class Option:
    """One option of `run_args` as the engine reads it."""

    index: int  # of the argument in run_args that names it
    text: str  # the arguments it was given in: `-itd`, `--volume=A:B`, `-v A:B`
    flag: str  # as given: `--detach`, or `-d` for the `d` of `-itd`
    name: str  # its long name (`--detach` for `-d`); the flag itself when it has none
    value: str | None = None  # the value it takes, when it takes one


def options(args: Sequence[str], engine: str) -> list[Option]:
    """The options `args` give the engine (`engine`: podman, docker or apptainer), in order.
    An argument that is no option (the engine would take it for the image) is left out."""
    short, takes = (APPTAINER_SHORT, APPTAINER_TAKES_VALUE) if engine == "apptainer" else \
        (SHORT, TAKES_VALUE)
    out: list[Option] = []
    i = 0
    while i < len(args):
        arg, at = args[i], i
        i += 1
        if arg.startswith("--") and len(arg) > 2:
            name, eq, value = arg.partition("=")
            text = arg
            if not eq and name in takes and i < len(args):
                value, i = args[i], i + 1
                text = f"{arg} {value}"
            out.append(Option(at, text, name, name, value if eq or name in takes else None))
        elif arg.startswith("-") and len(arg) > 1:
            for j, letter in enumerate(arg[1:], start=2):
                name = short.get(letter, f"-{letter}")
                if arg[j:j + 1] == "=":  # `-d=true`: the rest is this flag's value
                    out.append(Option(at, arg, f"-{letter}", name, arg[j + 1:]))
                    break
                if name not in takes:
                    out.append(Option(at, arg, f"-{letter}", name))
                    continue
                value, text = arg[j:].removeprefix("="), arg
                if not value and i < len(args):
                    value, i = args[i], i + 1
                    text = f"{arg} {value}"
                out.append(Option(at, text, f"-{letter}", name, value))
                break
    return out


def own(option: Option, engine: str) -> str | None:
    """Why sweep sets `option` itself (None: the study may give it). A device option that
    names a GPU (`nvidia.com/gpu=...`, `/dev/nvidia*`) is sweep's too, as is a variable that
    picks the devices (`pinned`)."""
    if option.name == "--env" and pinned(option.value or ""):
        return OWN["--gpus"]
    if engine == "apptainer":
        return APPTAINER_OWN.get(option.name)
    if option.name == "--device" and (option.value or "").startswith(GPU_DEVICES):
        return OWN["--gpus"]
    return OWN.get(option.name)


def shown(option: Option) -> str:
    """What `option` sets, as the refusal names it: the flag (`-d (--detach)`), or the
    variable an `--env` sets."""
    if option.name == "--env" and option.value is not None:
        return option.value.split("=", 1)[0]
    return option.flag if option.flag == option.name else f"{option.flag} ({option.name})"


def pinned(env: str) -> str | None:
    """The variable picking a trial's devices that `env` (`NAME=VALUE`, or `NAME` or a
    pattern `NAME*` passing the host's, as `--env` and an `--env-file` line take it) sets;
    None if it sets none."""
    name = env.split("=", 1)[0].strip()
    if "=" not in env and name.endswith("*"):
        return next((v for v in DEVICE_VARIABLES if v.startswith(name[:-1])), None)
    return name if name in DEVICE_VARIABLES else None


def env_file_pins(text: str) -> str | None:
    """The variable picking a trial's devices that an `--env-file` holding `text` sets (its
    lines `NAME=VALUE` or `NAME`, `#` comments); None if none."""
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and (found := pinned(line)):
            return found
    return None


@dataclass(frozen=True)
class MountTarget:
    """Where a mount of `run_args` lands in the container, and what it shows there: `host`
    a path of the host's (None: a named volume, a tmpfs, an anonymous volume)."""

    path: str
    host: str | None = None


def mounts(option: Option, engine: str) -> list[MountTarget]:
    """The mounts `option` adds (none for another option)."""
    value = option.value
    if value is None:
        return []
    if option.name == "--mount":
        fields = dict(f.split("=", 1) for f in value.split(",") if "=" in f)
        target = next((fields[k] for k in ("target", "destination", "dst", "dest")
                       if k in fields), None)
        source = next((fields[k] for k in ("source", "src") if k in fields), None)
        if target is None:
            return []
        bind = fields.get("type", "volume") == "bind"
        return [MountTarget(target, source if bind else None)]
    if engine == "apptainer":
        if option.name != "--bind":
            return []
        out = []
        for spec in value.split(","):
            parts = spec.split(":")
            out.append(MountTarget(parts[1] if len(parts) > 1 and parts[1] else parts[0],
                              parts[0]))
        return out
    if option.name == "--tmpfs":
        return [MountTarget(value.split(":", 1)[0])]
    if option.name == "--volume":
        parts = value.split(":")
        if len(parts) == 1:  # an anonymous volume at that path
            return [MountTarget(parts[0])]
        host = parts[0] if parts[0].startswith(("/", ".")) else None  # else a named volume
        return [MountTarget(parts[1], host)]
    return []
