"""Optional dependencies, imported on first use."""

from __future__ import annotations

import os
from typing import Any


def import_grpc() -> Any:
    """`import grpc` with gRPC's own logging off (it would print its errors on stderr, e.g.
    "Failed to add port", besides sweep's one line), unless $GRPC_VERBOSITY says otherwise.
    The setting is read once, at the first import; trials do not inherit it."""
    if "GRPC_VERBOSITY" in os.environ:
        import grpc

        return grpc
    os.environ["GRPC_VERBOSITY"] = "NONE"
    try:
        import grpc
    finally:
        del os.environ["GRPC_VERBOSITY"]
    return grpc
