"""`sweep storage-proxy`: serve a study database to many drivers over gRPC (they use
`grpc://host:port`)."""

from __future__ import annotations

import argparse

from sweep.commands._args import Verbs, common


def add_parser(verbs: Verbs) -> argparse.ArgumentParser:
    """`sweep storage-proxy [--host H] [--port P] [--threads N] --storage URL`."""
    prox = verbs.add_parser(
        "storage-proxy", help="serve a database to many drivers (they use grpc://host:port)")
    prox.add_argument("--host", default="0.0.0.0", help="address to listen on (default all)")
    prox.add_argument("--port", type=int, default=13000, help="port (default 13000; 0: any)")
    prox.add_argument("--threads", type=int, default=64,
                      help="server threads (default 64; about two per driver is plenty)")
    prox.set_defaults(func=main)
    return common(prox)


def main(args: argparse.Namespace) -> int:
    """Serve until stopped; the storage comes from `--storage` or $SWEEP_STORAGE."""
    import os

    from sweep._core import UsageError
    from sweep.spec import StorageUrl, StorageUrlError, config
    from sweep.study import proxy

    url = args.storage or os.environ.get(config.STORAGE_ENV)
    if not url:
        raise UsageError("storage-proxy: give --storage URL (or set $SWEEP_STORAGE)")
    try:
        storage = StorageUrl.parse(url)
    except StorageUrlError as e:
        given = "--storage" if args.storage else f"${config.STORAGE_ENV}"
        raise UsageError(f"{given}: {e}") from None
    return proxy.serve(storage, args.host, args.port, args.threads)
