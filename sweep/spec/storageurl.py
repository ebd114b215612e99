"""Storage URLs: which kind of storage a URL names, its parts, how it may be printed (no
secrets), and whether sweep can use it, all without connecting or creating anything."""

from __future__ import annotations

import os
from pathlib import Path

from sweep._core import secrets
from sweep._core.errors import ConfigError
from sweep._core.optional import import_grpc


def shown_url(url: str) -> str:
    """A storage URL as it may be printed: no password, nor secrets in its query string."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
        parsed.port  # noqa: B018
    except (ArgumentError, ValueError):
        return "<storage URL>"
    secret = {k: "***" for k in parsed.query if secrets.NAME.search(k)}
    shown = parsed.update_query_dict(secret).render_as_string(hide_password=True)
    return shown.replace("%2A%2A%2A", "***")


def redact(text: str, url: str) -> str:
    """`text` with the secrets of `url` (password, secret query values) blanked out."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
        parsed.port  # noqa: B018
    except (ArgumentError, ValueError):
        return text
    hidden = [parsed.password] if parsed.password else []
    for key, value in parsed.query.items():
        if secrets.NAME.search(key):
            hidden += [value] if isinstance(value, str) else list(value)
    for secret in hidden:
        if secret:
            text = text.replace(str(secret), "***")
    return text



JOURNAL, GRPC = "journal://", "grpc://"


def storage_kind(url: str) -> str:
    """"journal" (Optuna's JournalStorage on a file), "grpc" (Optuna's gRPC storage proxy)
    or "rdb" (a database through SQLAlchemy)."""
    if url.startswith(JOURNAL):
        return "journal"
    if url.startswith(GRPC):
        return "grpc"
    return "rdb"


def journal_path(url: str) -> Path:
    """The file of a `journal:///path` URL."""
    return Path(url.removeprefix(JOURNAL))


def grpc_address(url: str) -> tuple[str, int]:
    """(host, port) of a `grpc://host:port` URL, an IPv6 host kept in its brackets as gRPC's
    targets want it (ValueError if it has neither)."""
    rest = url.removeprefix(GRPC).rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or "/" in rest or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(url)
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise ValueError(url)  # an IPv6 address goes in brackets: grpc://[::1]:13000
    return host, int(port)


def check_storage_url(file: str, url: str, key: str = "study.storage") -> None:
    """Refuse a storage URL sweep cannot use, without connecting or creating anything; the
    `ConfigError` blames `key`, where the URL came from (`study.storage`, `--storage`,
    `$SWEEP_STORAGE`)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    kind = storage_kind(url)
    if kind == "journal":
        path = journal_path(url)
        if not path.is_absolute() or path.name in ("", ".", ".."):
            raise ConfigError(file, key, "a journal storage needs an absolute "
                              "file path: journal:///shared/path/study.log")
        if not path.parent.is_dir():
            raise ConfigError(file, key, f"folder does not exist: {path.parent}")
        return
    if kind == "grpc":
        try:
            grpc_address(url)
        except ValueError:
            raise ConfigError(file, key, "a gRPC storage proxy URL is "
                              "grpc://host:port (see `sweep storage-proxy`)") from None
        try:
            import_grpc()
        except ImportError:
            raise ConfigError(file, key, "no grpcio for grpc:// "
                              "(pip install 'sweep[grpc]')") from None
        return
    try:
        parsed = make_url(url)
        parsed.port  # noqa: B018 (a port that is no number raises here)
    except (ArgumentError, ValueError):
        raise ConfigError(
            file, key, "not a database URL (e.g. sqlite:///sweep.db or "
            "postgresql://user@host/db)"
        ) from None
    shown = shown_url(url)
    try:
        dialect = parsed.get_dialect()
        dialect.import_dbapi()
    except NoSuchModuleError:
        raise ConfigError(file, key, f"unknown database kind in {shown}") from None
    except ImportError as e:
        postgres = parsed.get_backend_name() == "postgresql"
        hint = " (pip install 'sweep[postgres]')" if postgres else ""
        raise ConfigError(
            file, key, f"no driver for {shown}: {e.name or e}{hint}"
        ) from None
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        db = Path(parsed.database)
        folder = (db if db.is_absolute() else Path.cwd() / db).parent
        if not folder.is_dir():
            raise ConfigError(file, key, f"folder does not exist: {folder}")


DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306, "mariadb": 3306}


def storage_identity(url: str) -> str:
    """The storage a (shown) storage URL reaches, as text that two URLs of one storage share:
    a SQLite or journal file by its real path (links and `//` resolved, a relative one from
    the current folder); a database by its kind without the driver (`postgresql+psycopg` is
    `postgresql`), user, host (lowercased, `localhost` as `127.0.0.1`), port (the default
    one filled in) and database, without password or query; a gRPC proxy by host:port. One
    study reached through a gRPC proxy and directly is two storages here. A URL that does
    not parse is itself."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    if url.startswith(JOURNAL):
        return JOURNAL + os.path.realpath(journal_path(url))
    if url.startswith(GRPC):
        try:
            host, grpc_port = grpc_address(url)
        except ValueError:
            return url
        return f"{GRPC}{_host(host)}:{grpc_port}"
    try:
        parsed = make_url(url)
        backend, port = parsed.get_backend_name(), parsed.port or None
    except (ArgumentError, ValueError):
        return url
    if backend == "sqlite":
        db = parsed.database
        return f"sqlite:///{os.path.realpath(db) if db and db != ':memory:' else db or ''}"
    port = port or DEFAULT_PORTS.get(backend)
    return (f"{backend}://{parsed.username or ''}@{_host(parsed.host or '')}:{port or ''}"
            f"/{parsed.database or ''}")


def _host(host: str) -> str:
    host = host.lower()
    return "127.0.0.1" if host == "localhost" else host
