"""A named lock served beside Optuna's gRPC storage proxy, for drivers that reach the study only
through the proxy (the budget check and the `ask` under one lock, as with a database).

The lock is held for as long as the holder's call stays open: the holder cancels it to release,
and a holder that dies drops its connection, which releases it too; one that keeps it
`MAX_HOLD` s (a frozen process) loses it. A waiter is answered "busy" after `WAIT` s and asks
again, so waiters never hold the server's threads for long.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from sweep._core import import_grpc

METHOD = "/sweep.Lock/Hold"
WAIT = 0.5  # s a request waits for the lock before the server answers "busy"
MAX_HOLD = 60.0  # s a holder keeps it at most: one holding longer is frozen, not working
HELD, BUSY = b"held", b"busy"


class LockService:
    """The server side: one `threading.Lock` per name."""

    def __init__(self) -> None:
        self._locks: dict[bytes, threading.Lock] = {}
        self._guard = threading.Lock()

    def handler(self) -> Any:
        """The generic RPC handler to add to a `grpc.Server`."""
        grpc = import_grpc()

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
            deadline = time.monotonic() + MAX_HOLD
            while not ended.wait(min(5.0, max(0.0, deadline - time.monotonic()))) and (
                    context.is_active() and time.monotonic() < deadline):
                pass
        finally:
            lock.release()


class Holder:
    """The client side: `try_hold()` asks once (the server waits up to `WAIT` s); the lock, once
    held, is released when the `with` block ends."""

    def __init__(self, channel: Any, name: str) -> None:
        self._hold = channel.unary_stream(METHOD)
        self.name = name
        self._call: Any = None

    def try_hold(self) -> bool:
        # the deadline covers the whole hold: a proxy that stops answering cannot hang us
        call = self._hold(self.name.encode(), timeout=MAX_HOLD + 5.0)
        try:
            reply = next(call)
        except StopIteration:
            reply = BUSY
        if reply == HELD:
            self._call = call
            return True
        call.cancel()
        return False

    def __enter__(self) -> Holder:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._call is not None:
            self._call.cancel()
            self._call = None


@contextlib.contextmanager
def held(channel: Any, name: str) -> Iterator[None]:
    """Hold the lock `name` of the server behind `channel` for the `with` block (waiting as
    long as it takes)."""
    with Holder(channel, name) as holder:
        while not holder.try_hold():
            pass
        yield
