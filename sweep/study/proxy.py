"""`sweep storage-proxy`: Optuna's gRPC storage proxy in front of one database, plus the lock
drivers take around the budget check and the `ask` (see `_grpclock`).

Hundreds of drivers then share one pool of database connections, in this process. The
database must be one SQLAlchemy can open; Optuna's proxy does not serve journal storages.
"""

from __future__ import annotations

import signal
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sweep._core import UsageError, import_grpc
from sweep.spec import StorageUrl
from sweep.study import _grpclock, _optuna_compat


def make_server(url: StorageUrl, host: str, port: int, threads: int) -> tuple[Any, int]:
    """A started gRPC server proxying `url` and serving the lock; (server, its port).

    `port` 0 picks a free one. UsageError if the storage cannot be opened or the port taken.
    """
    import optuna

    grpc = import_grpc()
    if not url.kind.database:
        raise UsageError(f"--storage: the proxy serves a database (sqlite:///..., "
                         f"postgresql://...), not {url.shown}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        with warnings.catch_warnings():  # e.g. SQLAlchemy's about a query string it ignores
            warnings.simplefilter("ignore")
            storage = optuna.storages.get_storage(url.url)
    except Exception as e:
        cause = str(getattr(e, "orig", None) or e).splitlines()[0]
        raise UsageError(f"--storage: cannot open {url.shown}: "
                         f"{url.redact(cause)}") from None
    # SO_REUSEPORT would let a second proxy share the port and split the drivers between two
    # locks: refuse a taken port instead.
    server = grpc.server(ThreadPoolExecutor(max_workers=threads),
                         options=[("grpc.so_reuseport", 0)])
    _optuna_compat.add_storage_service(server, storage)  # Optuna's own hides the port bound
    server.add_generic_rpc_handlers((_grpclock.LockService().handler(),))
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError:
        bound = 0
    if not bound:
        raise UsageError(f"--port: cannot listen on {host}:{port} (in use, or not an "
                         "address of this host)")
    port = bound
    server.start()
    return server, port


def serve(url: StorageUrl, host: str, port: int, threads: int, say: Any = print) -> int:
    """Run the proxy until SIGTERM or SIGINT; the exit code."""
    server, port = make_server(url, host, port, threads)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    say(f"storage proxy for {url.shown} on {host}:{port} "
        f"(drivers use storage: grpc://<this host>:{port})", flush=True)
    stop.wait()
    server.stop(grace=2).wait()
    return 0
