"""Storage URLs, parsed once: `StorageUrl` says which kind of storage a URL names, its parts
(file, address), how it may be printed (no secrets), which storage it reaches (`identity`) and
where the budget lock of a file storage lies; `check` says whether sweep can use it, all
without connecting or creating anything.

The one module that parses a storage URL (SQLAlchemy's `make_url`) or decides its kind: every
other module reads a `StorageUrl` (`Spec.storage`; `StorageUrl.parse` at a command line's edge).
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweep._core import ConfigError, import_grpc, secrets

JOURNAL, GRPC = "journal://", "grpc://"
DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306, "mariadb": 3306}
NOT_A_DATABASE = "not a database URL (e.g. sqlite:///sweep.db or postgresql://user@host/db)"
NOT_A_JOURNAL = "a journal storage needs an absolute file path: journal:///shared/path/study.log"
NOT_A_PROXY = "a gRPC storage proxy URL is grpc://host:port (see `sweep storage-proxy`)"


class StorageKind(enum.Enum):
    """Which storage a URL names."""

    SQLITE = "sqlite"  # a SQLite file
    MEMORY = "memory"  # SQLite in memory: sqlite://, sqlite:///:memory:
    POSTGRESQL = "postgresql"
    DATABASE = "database"  # another database SQLAlchemy opens (MySQL, ...)
    JOURNAL = "journal"  # Optuna's JournalStorage on a file
    GRPC = "grpc"  # Optuna's gRPC storage proxy (`sweep storage-proxy`)

    @property
    def database(self) -> bool:
        """Whether it is opened through SQLAlchemy (Optuna's `RDBStorage`)."""
        return self in (StorageKind.SQLITE, StorageKind.MEMORY, StorageKind.POSTGRESQL,
                        StorageKind.DATABASE)


class StorageUrlError(ValueError):
    """Not a storage URL sweep knows; the message says what is wrong and what to write."""


@dataclass(frozen=True)
class StorageUrl:
    """A storage URL, parsed: `url` as given (what Optuna opens), its `kind`, its `file` (a
    SQLite or journal file, as written: a relative SQLite one is from the current folder),
    its `address` (a gRPC proxy's (host, port), an IPv6 host in brackets), `shown` (as it may
    be printed: no password, no secret query value) and `backend` (SQLAlchemy's name of the
    database, `journal` or `grpc`). Its repr holds no secret."""

    url: str = field(repr=False)  # a password and all: `shown` is what may be printed
    kind: StorageKind
    shown: str
    backend: str
    file: Path | None = None
    address: tuple[str, int] | None = None
    _identity: str = field(default="", repr=False)  # a database's; a file's is read when asked
    _secrets: tuple[str, ...] = field(default=(), repr=False)
    _parsed: Any = field(default=None, repr=False, compare=False)  # SQLAlchemy's URL

    @classmethod
    def parse(cls, url: str) -> StorageUrl:
        """`url` parsed, without connecting or touching the filesystem; `StorageUrlError`
        (what is wrong, what to write) if it is no storage URL."""
        parsed = _sqlalchemy_url(url)
        shown = "<storage URL>" if parsed is None else _shown(parsed)
        hidden = () if parsed is None else _secrets_of(parsed)
        if url.startswith(JOURNAL):
            path = Path(url.removeprefix(JOURNAL))
            if not path.is_absolute() or path.name in ("", ".", ".."):
                raise StorageUrlError(NOT_A_JOURNAL)
            return cls(url, StorageKind.JOURNAL, shown, "journal", file=path, _secrets=hidden)
        if url.startswith(GRPC):
            try:
                host, port = grpc_address(url)
            except ValueError:
                raise StorageUrlError(NOT_A_PROXY) from None
            return cls(url, StorageKind.GRPC, shown, "grpc", address=(host, port),
                       _identity=f"{GRPC}{_host(host)}:{port}", _secrets=hidden)
        if parsed is None:
            raise StorageUrlError(NOT_A_DATABASE)
        backend = parsed.get_backend_name()
        found: dict[str, Any] = dict(url=url, shown=shown, backend=backend, _secrets=hidden,
                                     _parsed=parsed)
        if backend == "sqlite":
            db = parsed.database
            if db in (None, "", ":memory:"):
                return cls(kind=StorageKind.MEMORY, _identity=f"sqlite:///{db or ''}", **found)
            return cls(kind=StorageKind.SQLITE, file=Path(db), **found)
        db_port = parsed.port or DEFAULT_PORTS.get(backend)
        identity = (f"{backend}://{parsed.username or ''}@{_host(parsed.host or '')}:"
                    f"{db_port or ''}/{parsed.database or ''}")
        kind = StorageKind.POSTGRESQL if backend == "postgresql" else StorageKind.DATABASE
        return cls(kind=kind, _identity=identity, **found)

    @property
    def identity(self) -> str:
        """The storage the URL reaches, as text that two URLs of one storage share: a SQLite
        or journal file by its real path now (links and `//` resolved, a relative one from the
        current folder); a database by its kind without the driver (`postgresql+psycopg` is
        `postgresql`), user, host (lowercased, `localhost` as `127.0.0.1`), port (the default
        one filled in) and database, without password or query; a gRPC proxy by host:port.
        One study reached through a gRPC proxy and directly is two storages here."""
        if self.file is None:
            return self._identity
        prefix = JOURNAL if self.kind is StorageKind.JOURNAL else "sqlite:///"
        return prefix + os.path.realpath(self.file)

    @property
    def lock_path(self) -> Path | None:
        """The budget lock's file of a file storage, one per file however named (links
        resolved now): `<file>.lock` beside a SQLite file, `<file>.budget.lock` beside a
        journal; None for other storages."""
        if self.file is None:
            return None
        suffix = ".budget.lock" if self.kind is StorageKind.JOURNAL else ".lock"
        return Path(f"{os.path.realpath(self.file)}{suffix}")

    def redact(self, text: str) -> str:
        """`text` with the URL's secrets (password, secret query values) blanked out."""
        for secret in self._secrets:
            text = text.replace(secret, secrets.STARS)
        return text


def check(file: str, url: str, key: str = "study.storage") -> StorageUrl:
    """`url` parsed, and refused if sweep cannot use it here, without connecting or creating
    anything: a `ConfigError` that blames `key`, where the URL came from (`study.storage`,
    `--storage`, `$SWEEP_STORAGE`)."""
    from sqlalchemy.exc import NoSuchModuleError

    try:
        storage = StorageUrl.parse(url)
    except StorageUrlError as e:
        raise ConfigError(file, key, str(e)) from None
    if storage.kind is StorageKind.GRPC:
        try:
            import_grpc()
        except ImportError:
            raise ConfigError(file, key, "no grpcio for grpc:// "
                              "(pip install 'sweep[grpc]')") from None
        return storage
    if storage.kind.database:
        try:
            storage._parsed.get_dialect().import_dbapi()
        except NoSuchModuleError:
            raise ConfigError(file, key, f"unknown database kind in {storage.shown}") from None
        except ImportError as e:
            postgres = storage.kind is StorageKind.POSTGRESQL
            hint = " (pip install 'sweep[postgres]')" if postgres else ""
            raise ConfigError(
                file, key, f"no driver for {storage.shown}: {e.name or e}{hint}"
            ) from None
    if storage.file is not None:
        folder = (storage.file if storage.file.is_absolute() else Path.cwd() / storage.file).parent
        if not folder.is_dir():
            raise ConfigError(file, key, f"folder does not exist: {folder}")
    return storage


def shown_url(url: str) -> str:
    """A storage URL as it may be printed: no password, nor secrets in its query string."""
    parsed = _sqlalchemy_url(url)
    return "<storage URL>" if parsed is None else _shown(parsed)


def storage_identity(url: str) -> str:
    """`StorageUrl.identity` of a URL as text (as a study.json keeps its shown form); a URL
    that does not parse is itself."""
    try:
        return StorageUrl.parse(url).identity
    except StorageUrlError:
        return url


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


def _sqlalchemy_url(url: str) -> Any:
    """SQLAlchemy's parse of `url` (a journal's and a proxy's too); None if it has none."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
        parsed.port  # noqa: B018 (a port that is no number raises here)
    except (ArgumentError, ValueError):
        return None
    return parsed


def _shown(parsed: Any) -> str:
    secret = {k: secrets.STARS for k in parsed.query if secrets.NAME.search(k)}
    shown = parsed.update_query_dict(secret).render_as_string(hide_password=True)
    return str(shown).replace("%2A%2A%2A", secrets.STARS)


def _secrets_of(parsed: Any) -> tuple[str, ...]:
    hidden = [parsed.password] if parsed.password else []
    for key, value in parsed.query.items():
        if secrets.NAME.search(key):
            hidden += [value] if isinstance(value, str) else list(value)
    return tuple(str(s) for s in hidden if s)


def _host(host: str) -> str:
    host = host.lower()
    return "127.0.0.1" if host == "localhost" else host
