"""A SQLite study written while another process holds it (a reader, a worker, `tuner export`) waits its turn
instead of failing after sqlite3's 5 s default: the last CI run lost a SIGTERM's exit status 130 to a
"database is locked" commit on a loaded machine. And a stage interrupted while the storage is busy still
ends with the interrupt, not with the storage's error."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import optuna
import pytest

from tuner.interrupts import Terminated
from tuner.study.storage import make_storage


def test_a_write_waits_out_a_lock_longer_than_sqlites_default(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    storage = make_storage(url)
    study = optuna.create_study(study_name="s", storage=storage)
    held = threading.Event()

    def hold() -> None:
        db = sqlite3.connect(tmp_path / "study.db", timeout=0)
        db.execute("BEGIN EXCLUSIVE")
        held.set()
        time.sleep(6.5)  # past the 5 s a default sqlite3 connection waits
        db.rollback()
        db.close()

    t = threading.Thread(target=hold)
    t.start()
    held.wait(10)
    t0 = time.monotonic()
    study.set_user_attr("k", 1)  # would raise "database is locked" after 5 s
    assert time.monotonic() - t0 > 5 and study.user_attrs["k"] == 1
    t.join()


def test_a_stage_interrupted_while_the_storage_fails_ends_with_the_interrupt() -> None:
    from tuner.search.pipeline import _timed

    class Busy:
        def add_seconds(self, stage: str, s: float) -> None:
            raise optuna.exceptions.StorageInternalError("database is locked")

    with pytest.raises(Terminated), _timed(Busy(), "tune"):  # type: ignore[arg-type]
        raise Terminated("SIGTERM")
    with pytest.raises(optuna.exceptions.StorageInternalError), _timed(Busy(), "tune"):  # type: ignore[arg-type]
        pass  # no interrupt: the storage's error is the error
