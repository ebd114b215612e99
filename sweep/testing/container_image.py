"""The podman image the container tests run trials in: a Debian root with python3, built once
with debootstrap from the machine's package mirror and kept in podman's store as `TEST_IMAGE`.

Standard library only, so a CI script can build it with the system's Python while it installs
the project (`python3 sweep/testing/container_image.py`: 1 to 3 minutes, mostly downloads and
unpacking), and the tests' fixture (`tests/e2e/test_container.py`) finds it made; the fixture
builds it itself where it is missing. Needs Debian's `podman`, `runc` and `debootstrap`.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

TEST_IMAGE = "localhost/sweep-test-python:bookworm-1"  # built once, kept in podman's store
MARKER = "/etc/sweep-test-image"  # only the test images have it


def mirror() -> str:
    """The Debian mirror apt uses here (the first `URIs:` of debian.sources)."""
    try:
        for line in Path("/etc/apt/sources.list.d/debian.sources").read_text().splitlines():
            if line.startswith("URIs:"):
                return line.split()[1]
    except OSError:
        pass
    return "http://deb.debian.org/debian"


def containers_conf(folder: Path) -> Path:
    """The CONTAINERS_CONF podman needs on this kind of machine (../shared/FACTS.md): runc
    (crun cannot run in this cgroup setup), cgroupfs, and ulimits no higher than this
    process's own (they cannot be raised without CAP_SYS_RESOURCE)."""
    def limit(which: int) -> int:
        soft, hard = resource.getrlimit(which)
        return min(v for v in (1024, soft, hard) if v != resource.RLIM_INFINITY)

    nofile, nproc = limit(resource.RLIMIT_NOFILE), limit(resource.RLIMIT_NPROC)
    path = folder / "containers.conf"
    path.write_text(f'[containers]\ndefault_ulimits = ["nofile={nofile}:{nofile}", '
                    f'"nproc={nproc}:{nproc}"]\n[engine]\nruntime = "runc"\n'
                    'cgroup_manager = "cgroupfs"\n')
    return path


def exists(tag: str = TEST_IMAGE) -> bool:
    """Whether podman's store holds `tag`."""
    return subprocess.run(["podman", "image", "exists", tag]).returncode == 0


def build(folder: Path, tag: str = TEST_IMAGE) -> None:
    """A Debian root with python3 (debootstrap from the local mirror), marked by MARKER,
    imported into podman as `tag`. The root and its tar are made in a new folder of its own
    in `folder`, removed after, success or not, without crossing into a file system mounted
    inside the root."""
    work = Path(tempfile.mkdtemp(prefix="debootstrap-", dir=folder))
    root, tar = work / "root", work / "root.tar"
    try:
        subprocess.run(["debootstrap", "--variant=minbase", "--include=python3", "bookworm",
                        str(root), mirror()], check=True, capture_output=True, timeout=900)
        (root / MARKER.lstrip("/")).write_text("sweep test image\n")
        subprocess.run(["tar", "-C", str(root), "-cf", str(tar), "."], check=True, timeout=300)
        subprocess.run(["podman", "import", str(tar), tag], check=True, capture_output=True,
                       timeout=300)
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(work)], check=False)


def main() -> int:
    """Build `TEST_IMAGE` unless podman's store has it; 0 once it is there."""
    if exists():
        return 0
    folder = Path(tempfile.mkdtemp(prefix="sweep-image-"))
    os.environ["CONTAINERS_CONF"] = str(containers_conf(folder))
    try:
        build(folder)
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(folder)], check=False)
    print(f"built {TEST_IMAGE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
