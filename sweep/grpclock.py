"""A named lock served beside Optuna's gRPC storage proxy, for drivers that reach the study only
through the proxy (the budget check and the `ask` under one lock, as with a database).

The lock is held for as long as the holder's call stays open: the holder cancels it to release,
and a holder that dies drops its connection, which releases it too. A waiter is answered "busy"
after `WAIT` s and asks again, so waiters never hold the server's threads for long.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

METHOD = "/sweep.Lock/Hold"
WAIT = 0.5  # s a request waits for the lock before the server answers "busy"
HELD, BUSY = b"held", b"busy"


class LockService:
    """The server side: one `threading.Lock` per name."""

    def __init__(self) -> None:
        self._locks: dict[bytes, threading.Lock] = {}
        self._guard = threading.Lock()

    def handler(self) -> Any:
        """The generic RPC handler to add to a `grpc.Server`."""
        import grpc

        method = grpc.unary_stream_rpc_method_handler(self._hold)
        return grpc.method_handlers_generic_handler("sweep.Lock", {"Hold": method})

    def _hold(self, name: bytes, context: Any) -> Iterator[bytes]:
        with self._guard:
            lock = self._locks.setdefault(name, threading.Lock())
        if not lock.acquire(timeout=WAIT):
            yield BUSY
            return
        try:
            ended = threading.Event()
            if not context.add_callback(ended.set):
                return  # the call ended already
            yield HELD
            while not ended.wait(5.0) and context.is_active():
                pass
        finally:
            lock.release()


@contextlib.contextmanager
def held(channel: Any, name: str) -> Iterator[None]:
    """Hold the lock `name` of the server behind `channel` for the `with` block."""
    hold = channel.unary_stream(METHOD)
    while True:
        call = hold(name.encode())
        try:
            reply = next(call)
        except StopIteration:
            reply = BUSY
        if reply == HELD:
            break
        call.cancel()
    try:
        yield
    finally:
        call.cancel()
