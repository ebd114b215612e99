"""Free TCP ports of 127.0.0.1 for the throwaway servers the tests start (Slurm, PostgreSQL)."""

from __future__ import annotations

import socket


def free_ports(n: int) -> list[int]:
    """`n` different ports that no socket is bound to now (the kernel's picks, all held until
    all are picked). Another process can take one before its server binds it."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()
