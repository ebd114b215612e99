"""Opening a database storage: Optuna's schema check, with Optuna's schema history read once per
process (`storage.checked_rdb`), against Optuna's public RDBStorage."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import alembic.script
import optuna
import pytest

from sweep.study import storage


@pytest.fixture
def history_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each read of Optuna's schema history (alembic's script folder) from now on, in a
    process that has read none yet."""
    monkeypatch.setattr(storage, "_SCHEMA_HEAD", {})
    reads: list[str] = []
    inner = alembic.script.ScriptDirectory.from_config

    def counted(config: object) -> alembic.script.ScriptDirectory:
        reads.append("read")
        return inner(config)  # type: ignore[arg-type]

    monkeypatch.setattr(alembic.script.ScriptDirectory, "from_config", counted)
    return reads


def made(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    optuna.storages.RDBStorage(url).engine.dispose()
    return url


def test_a_process_reads_optunas_schema_history_once_whatever_it_opens(tmp_path, history_reads):
    """Optuna's own check reads the whole history at every open; here the first open of an
    existing file reads it once, later opens of it or of another file not at all."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    url, other = made(tmp_path / "a"), made(tmp_path / "b")
    history_reads.clear()
    for opened in (url, url, other):
        rdb = storage.checked_rdb(opened, skip_table_creation=True)
        assert rdb.get_current_version() == rdb.get_head_version()
        rdb.engine.dispose()
        history_reads.pop()  # get_head_version's own read, asked by this test
    assert history_reads == ["read"]  # the first open's


def test_a_file_of_another_schema_gets_optunas_own_error(tmp_path, history_reads):
    """A file whose schema is an earlier revision (written by an older Optuna) is refused as
    Optuna refuses it, in Optuna's words, though this process knows the last revision."""
    url = made(tmp_path)
    storage.checked_rdb(url).engine.dispose()  # the last revision known from here on
    rdb = optuna.storages.RDBStorage(url, skip_compatibility_check=True)
    earlier = rdb.get_all_versions()[1]
    rdb.engine.dispose()
    with sqlite3.connect(tmp_path / "study.db") as db:  # as an older Optuna left it
        db.execute("UPDATE alembic_version SET version_num = ?", (earlier,))
    with pytest.raises(RuntimeError, match="optuna storage upgrade"):
        storage.checked_rdb(url)
