"""`StorageUrl`: a storage URL parsed once, at the edge, and the one place that parses one.

The type is tested on every kind it tells apart; the scan at the end fails when another module
of sweep parses a storage URL (`make_url`) or decides its kind from its text.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
from pathlib import Path

import pytest
from conftest import run_cli, study_dict

import sweep
from sweep._core.errors import ConfigError
from sweep.spec import config, schema, storageurl
from sweep.spec.storageurl import StorageKind, StorageUrl, StorageUrlError

PACKAGE = Path(sweep.__file__).parent
OWNER = PACKAGE / "spec" / "storageurl.py"


# ---- the kinds and their parts ------------------------------------------------------------


def test_a_relative_sqlite_file_is_from_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url = StorageUrl.parse("sqlite:///study.db")
    assert (url.kind, url.file, url.address) == (StorageKind.SQLITE, Path("study.db"), None)
    assert (url.url, url.shown, url.backend) == ("sqlite:///study.db", "sqlite:///study.db",
                                                 "sqlite")
    real = os.path.realpath(tmp_path / "study.db")
    assert url.identity == f"sqlite:///{real}"
    assert url.lock_path == Path(f"{real}.lock")
    assert url.kind.database


def test_an_absolute_sqlite_file_is_one_storage_however_its_path_is_written(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    one = StorageUrl.parse(f"sqlite:///{tmp_path}/real/s.db")
    other = StorageUrl.parse(f"sqlite:///{tmp_path}/link//s.db")
    assert one.file == tmp_path / "real" / "s.db"
    assert one.identity == other.identity == f"sqlite:///{os.path.realpath(one.file)}"
    assert one.lock_path == other.lock_path == Path(f"{os.path.realpath(one.file)}.lock")
    assert one != other  # two URLs, as given


@pytest.mark.parametrize(("given", "identity"), [
    ("sqlite://", "sqlite:///"), ("sqlite:///:memory:", "sqlite:///:memory:")])
def test_sqlite_in_memory_has_no_file_and_no_lock(given, identity):
    url = StorageUrl.parse(given)
    assert (url.kind, url.file, url.lock_path, url.address) == (
        StorageKind.MEMORY, None, None, None)
    assert url.identity == identity
    assert url.kind.database


def test_a_postgresql_url_is_shown_and_redacted_without_its_secrets():
    url = StorageUrl.parse(
        "postgresql+psycopg://Me:hunter2@LocalHost/db?sslpassword=zebra99&application_name=a")
    assert (url.kind, url.backend, url.file, url.lock_path) == (
        StorageKind.POSTGRESQL, "postgresql", None, None)
    assert url.shown == ("postgresql+psycopg://Me:***@LocalHost/db"
                         "?application_name=a&sslpassword=***")
    assert url.identity == "postgresql://Me@127.0.0.1:5432/db"  # driver, password, query gone
    said = url.redact("auth failed for hunter2 (zebra99) as Me")
    assert said == "auth failed for *** (***) as Me"
    assert "hunter2" not in repr(url) and "zebra99" not in repr(url)


def test_postgresql_urls_of_one_database_share_an_identity():
    one = StorageUrl.parse("postgresql://u:a@localhost:5432/db")
    other = StorageUrl.parse("postgresql+psycopg://u:b@127.0.0.1/db?connect_timeout=3")
    assert one.identity == other.identity
    assert one.identity != StorageUrl.parse("postgresql://u@127.0.0.1:5433/db").identity


def test_another_database_is_a_database_with_its_default_port():
    url = StorageUrl.parse("mysql+pymysql://u:pw@db.example/s")
    assert (url.kind, url.backend, url.file) == (StorageKind.DATABASE, "mysql", None)
    assert url.identity == "mysql://u@db.example:3306/s"
    assert url.shown == "mysql+pymysql://u:***@db.example/s"
    assert url.kind.database


def test_a_journal_file_has_its_file_and_its_own_lock_name(tmp_path):
    (tmp_path / "link").symlink_to(tmp_path)
    url = StorageUrl.parse(f"journal:///{tmp_path}/link/j.log")
    assert (url.kind, url.backend, url.address) == (StorageKind.JOURNAL, "journal", None)
    assert url.file == Path(f"/{tmp_path}/link/j.log")
    assert url.identity == f"journal://{os.path.realpath(tmp_path / 'j.log')}"
    assert url.lock_path == Path(f"{os.path.realpath(tmp_path / 'j.log')}.budget.lock")
    assert not url.kind.database


@pytest.mark.parametrize(("given", "address", "identity"), [
    ("grpc://Proxy.Example:13000", ("Proxy.Example", 13000), "grpc://proxy.example:13000"),
    ("grpc://localhost:13000/", ("localhost", 13000), "grpc://127.0.0.1:13000"),
    ("grpc://[::1]:13000", ("[::1]", 13000), "grpc://[::1]:13000"),
])
def test_a_grpc_proxy_is_its_address(given, address, identity):
    url = StorageUrl.parse(given)
    assert (url.kind, url.address, url.file, url.lock_path) == (
        StorageKind.GRPC, address, None, None)
    assert url.identity == identity
    assert not url.kind.database


def test_the_value_is_frozen():
    url = StorageUrl.parse("sqlite:///s.db")
    with pytest.raises(dataclasses.FrozenInstanceError):
        url.kind = StorageKind.JOURNAL  # type: ignore[misc]


# ---- what is refused, in one line -----------------------------------------------------------


@pytest.mark.parametrize(("given", "message"), [
    ("not a url", storageurl.NOT_A_DATABASE),
    ("postgresql://u@h:port/db", storageurl.NOT_A_DATABASE),
    ("journal://relative.log", storageurl.NOT_A_JOURNAL),
    ("journal:///", storageurl.NOT_A_JOURNAL),
    ("journal:///tmp/..", storageurl.NOT_A_JOURNAL),
    ("grpc://host", storageurl.NOT_A_PROXY),
    ("grpc://host:0", storageurl.NOT_A_PROXY),
    ("grpc://host:13000/db", storageurl.NOT_A_PROXY),
    ("grpc://::1:13000", storageurl.NOT_A_PROXY),
])
def test_what_is_no_storage_url_is_one_error(given, message):
    with pytest.raises(StorageUrlError) as e:
        StorageUrl.parse(given)
    assert str(e.value) == message
    with pytest.raises(ConfigError) as c:
        storageurl.check("study.yaml", given, "--storage")
    assert str(c.value) == f"study.yaml: --storage: {message}"


def test_check_refuses_what_cannot_be_used_here(tmp_path):
    def refused(url: str) -> str:
        with pytest.raises(ConfigError) as e:
            storageurl.check("s.yaml", url)
        assert len(str(e.value).splitlines()) == 1
        return str(e.value)

    assert refused("nosuchdb://u:pw@h/d") == (
        "s.yaml: study.storage: unknown database kind in nosuchdb://u:***@h/d")
    assert refused("mysql://u:pw@h/d") == (
        "s.yaml: study.storage: no driver for mysql://u:***@h/d: MySQLdb")
    assert refused(f"sqlite:///{tmp_path}/none/s.db") == (
        f"s.yaml: study.storage: folder does not exist: {tmp_path}/none")
    assert refused(f"journal://{tmp_path}/none/j.log") == (
        f"s.yaml: study.storage: folder does not exist: {tmp_path}/none")
    ok = storageurl.check("s.yaml", f"sqlite:///{tmp_path}/s.db")
    assert ok == StorageUrl.parse(f"sqlite:///{tmp_path}/s.db")
    assert not list(tmp_path.iterdir())  # nothing created


def test_text_that_is_no_url_is_shown_as_a_placeholder_and_is_its_own_identity():
    assert storageurl.shown_url("not a url") == "<storage URL>"
    assert storageurl.storage_identity("not a url") == "not a url"
    assert storageurl.shown_url("postgresql://u:pw@h/d") == "postgresql://u:***@h/d"


# ---- parsed once, at the edge ---------------------------------------------------------------


def test_the_spec_carries_the_url_parsed_by_load(write_study, tmp_path):
    path = write_study()
    spec = config.load(path, runnable=False)
    assert spec.storage is spec.storage  # parsed once, by load
    assert spec.storage == StorageUrl.parse(f"sqlite:///{tmp_path / 'probe.db'}")
    assert spec.storage.url == spec.storage_url
    moved = spec.model_copy(update={"study": spec.study.model_copy(
        update={"storage": f"journal:///{tmp_path}/j.log"})})
    assert moved.storage.kind is StorageKind.JOURNAL  # a copy with another URL is not the old one's
    assert spec.storage.kind is StorageKind.SQLITE


def test_a_spec_made_without_load_parses_its_url_on_first_use(tmp_path):
    spec = schema.Spec.model_validate(study_dict(study={"storage": f"journal:///{tmp_path}/j"}))
    assert spec.storage == StorageUrl.parse(f"journal:///{tmp_path}/j")


def test_the_proxys_storage_flag_is_parsed_at_the_command_line(monkeypatch, capsys):
    monkeypatch.delenv(config.STORAGE_ENV, raising=False)
    assert run_cli("storage-proxy", "--storage", "not a url") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"sweep: error: --storage: {storageurl.NOT_A_DATABASE}"]
    monkeypatch.setenv(config.STORAGE_ENV, "grpc://h")
    assert run_cli("storage-proxy") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"sweep: error: ${config.STORAGE_ENV}: {storageurl.NOT_A_PROXY}"]


# ---- the one module -------------------------------------------------------------------------

PARSERS = {"make_url", "get_backend_name"}  # SQLAlchemy's parse of a URL, and its kind
SCHEME = re.compile(r"^(sqlite|journal|grpc|postgres|mysql|mariadb)|^[a-z][a-z0-9+.-]*://|^://$")
URL = re.compile(r"^[a-z][a-z0-9+.-]*://")


def url_decisions(path: Path) -> list[str]:
    """Where `path` parses a storage URL or decides its kind from its text: a SQLAlchemy parse
    (`make_url`, `get_backend_name`), or a test of a URL's scheme (`.startswith("sqlite")`,
    `.removeprefix("journal://")`, `.split("://")`, `"grpc://" in url`, `url[:6] == "sqlite"`)."""
    found = []

    def scheme(node: ast.expr, pattern: re.Pattern[str] = SCHEME) -> bool:
        texts = node.elts if isinstance(node, ast.Tuple) else [node]
        return any(isinstance(t, ast.Constant) and isinstance(t.value, str)
                   and pattern.search(t.value) for t in texts)

    for node in ast.walk(ast.parse(path.read_text())):
        name = node.attr if isinstance(node, ast.Attribute) else (
            node.id if isinstance(node, ast.Name) else None)
        decides = name in PARSERS
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                node.func.attr in ("startswith", "removeprefix", "partition", "rpartition",
                                   "split", "rsplit")):
            decides = any(scheme(arg) for arg in node.args)
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            decides = (isinstance(node.ops[0], (ast.In, ast.NotIn)) and scheme(node.left, URL)
                       ) or (any(isinstance(s, ast.Subscript) for s in sides)
                             and any(scheme(s) for s in sides))
        if decides:
            found.append(f"{path.name}:{getattr(node, 'lineno', 0)}: {ast.unparse(node)}")
    return found


def test_only_storageurl_parses_a_storage_url_or_decides_its_kind():
    found = {str(path.relative_to(PACKAGE)): url_decisions(path)
             for path in sorted(PACKAGE.rglob("*.py")) if path != OWNER}
    assert {k: v for k, v in found.items() if v} == {}
    assert url_decisions(OWNER)  # the scan sees them where they are


@pytest.mark.parametrize("source", [
    "from sqlalchemy.engine import make_url\nmake_url(u)\n",
    "u.startswith('sqlite')\n",
    "u.removeprefix('journal://')\n",
    "u.startswith(('grpc://', 'x'))\n",
    "kind = 'sqlite' if u[:6] == 'sqlite' else 'rdb'\n",
    "engine.url.get_backend_name() == 'postgresql'\n",
    "scheme = u.split('://')[0]\n",
    "if 'grpc://' not in u: pass\n",
])
def test_the_scan_finds_each_way_of_deciding(tmp_path, source):
    (tmp_path / "m.py").write_text(source)
    assert url_decisions(tmp_path / "m.py")
