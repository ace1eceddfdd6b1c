"""The study storage under faults: one check for search, worker and export (nothing created by a typo),
and a database lost in the middle of a tune trial (one paragraph, exit 1, the trial run again)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tuner.cli import main

# The tune fixture of the search's fault tests (a real CPU space and SQLite study, fakes for the rest); the
# child process below imports it the same way.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
_faults = importlib.import_module("unit.search.test_search_faults")
_tune_env, steady = _faults._tune_env, _faults.steady

REPO = Path(__file__).resolve().parents[3]
PG_DOWN = "postgresql+psycopg://tuner:s3cr3t@127.0.0.1:1/optuna"  # nothing listens on port 1: refused at once


def _run_cli(argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    monkeypatch.delenv("TUNER_DEBUG", raising=False)
    monkeypatch.setattr(sys, "argv", ["tuner", *argv])
    with pytest.raises(SystemExit) as e:
        main()
    return int(e.value.code or 0), capsys.readouterr().err


@pytest.mark.parametrize("cmd", ["export", "worker"])
def test_a_missing_sqlite_file_is_refused_and_not_created(
    cmd: str, isolated_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A typo in the path of a study that `tuner search` wrote: exit 2 naming the path, and no empty
    database left where it pointed (export and worker read a study; they create none)."""
    typo = tmp_path / "sutdy.db"
    argv = [cmd, "--storage", f"sqlite:///{typo}", "--study", "s"]
    argv += ["-o", str(tmp_path / "out")] if cmd == "export" else ["--arch", "cpu", "--run-dir", str(tmp_path / "r")]
    code, err = _run_cli(argv, monkeypatch, capsys)
    assert code == 2 and f"no study database at {typo}" in err, err
    assert not typo.exists() and not (tmp_path / "out").exists() and not (tmp_path / "r").exists()
    typo.touch()  # a file that is no study (an empty one, another program's database) is refused, not written
    code, err = _run_cli(argv, monkeypatch, capsys)
    assert code == 2 and "holds no Optuna study" in err and typo.stat().st_size == 0, err


@pytest.mark.parametrize("cmd", ["search", "worker", "export"])
def test_every_command_that_opens_a_storage_checks_it_first(
    cmd: str, isolated_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A server that refuses (down, a wrong password, no such database: the driver says which): exit 2
    with the URL, its password hidden, before anything is fetched, built or created; never exit 70."""
    pytest.importorskip("psycopg")
    argv = [cmd, "--storage", PG_DOWN, "--study", "s"]
    argv += ["-o", str(tmp_path / "out")] if cmd == "export" else ["--arch", "cpu", "--run-dir", str(tmp_path / "r")]
    code, err = _run_cli(argv, monkeypatch, capsys)
    assert code == 2 and "cannot open the study storage 'postgresql+psycopg://tuner:***@127.0.0.1:1/optuna'" in err
    assert "s3cr3t" not in err and "internal error" not in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "r").exists()
    assert not (isolated_home / "sources").exists()  # the storage was checked before the source was fetched


# ------------------------------------------------------------------ the database lost during a trial


# The search process: its database server stops while a tune trial measures. Every storage call then
# raises what SQLAlchemy raises for a refused connection, the heartbeat thread's too (every second here).
LOST_CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    import psycopg, sqlalchemy.exc
    import tuner.study.storage as storage_mod
    from tuner.errors import TunerError
    from unit.search.test_search_faults import _tune_env, steady

    storage_mod.HEARTBEAT_S = 1
    KEEP = ("get_heartbeat_interval", "get_heartbeat_stale_trial_callback")

    def server_stops(backend):
        def refused(*a, **k):
            raise sqlalchemy.exc.OperationalError(
                "SELECT 1", {{}}, psycopg.OperationalError('connection to server at "db", port 5432 failed: Connection refused')
            )
        for name in dir(backend):
            if not name.startswith("__") and name not in KEEP and callable(getattr(backend, name)):
                setattr(backend, name, refused)

    box = {{}}

    def measure(c, phase, depths, label):
        if "down" not in box:
            box["down"] = True
            server_stops(box["study"]._storage._backend)
            time.sleep(2.5)  # heartbeats fail meanwhile
        return steady(c, phase, depths, label)

    study, tune = _tune_env(Path({run!r}), measure)
    box["study"] = study
    try:
        with storage_mod.storage_guard({url!r}):
            tune()
    except TunerError as err:  # as tuner.cli.main prints it
        print(f"tuner: error: {{err}}", file=sys.stderr)
        sys.exit(err.exit_code)
""")


def test_a_database_lost_during_a_trial_is_one_paragraph_and_the_trial_runs_again(tmp_path: Path) -> None:
    from tuner.search import tune as tn

    code = LOST_CHILD.format(tests=str(REPO / "tests"), run=str(tmp_path), url="postgresql://tuner:s3cr3t@db/optuna")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Exception in thread" not in proc.stderr, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower() or "refused" in ln]  # the tune step's own lines aside
    assert errors == lines[-1:], proc.stderr[-3000:]
    assert errors[0].startswith("tuner: error: lost the study storage postgresql://tuner:***@db/optuna (")
    assert "Connection refused" in errors[0] and "rerun the same command" in errors[0] and "s3cr3t" not in errors[0]
    # the server is back: the next search fails the trial its dead process left RUNNING and runs it again
    study, tune = _tune_env(tmp_path, steady)
    assert [t.state.name for t in study.get_trials(deepcopy=False)] == ["RUNNING"]
    tune()
    trials = study.get_trials(deepcopy=False)
    assert [t.state.name for t in trials][:1] == ["FAIL"] and trials[0].user_attrs.get("status") == "interrupted"
    assert tn.count_done(study) == 2 and trials[1].params == trials[0].params  # re-queued with its parameters


def test_the_guard_leaves_other_errors_alone() -> None:
    """A bug stays a bug (exit 70 through main), a SQLite error stays the CLI's (a full disk's paragraph)."""
    import sqlite3

    import sqlalchemy.exc

    from tuner.study.storage import StorageLost, storage_guard

    with pytest.raises(ValueError), storage_guard(PG_DOWN):
        raise ValueError("boom")
    full = sqlalchemy.exc.OperationalError("INSERT", {}, sqlite3.OperationalError("database or disk is full"))
    with pytest.raises(sqlalchemy.exc.OperationalError), storage_guard("sqlite:////x/study.db"):
        raise full
    with pytest.raises(StorageLost) as e, storage_guard(PG_DOWN):
        raise sqlalchemy.exc.InterfaceError("SELECT 1", {}, Exception("connection already closed"))
    assert e.value.exit_code == 1 and "s3cr3t" not in str(e.value) and "connection already closed" in str(e.value)


@pytest.mark.parametrize(
    "message",
    [
        "table alembic_version already exists",
        "UNIQUE constraint failed: alembic_version.version_num",  # both inserted the schema version row
    ],
)
def test_a_database_another_process_is_creating_is_opened_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, message: str
) -> None:
    """Two processes opening a new SQLite study at once (a search and a reader of its study.db) both create
    Optuna's tables; the later one's "table ... already exists" is not a bad storage: it opens it again."""
    import sqlalchemy.exc

    import tuner.study.storage as storage_mod

    url = f"sqlite:///{tmp_path / 'study.db'}"
    real, calls = storage_mod._rdb_storage, []

    def racing(u: str, existing: bool) -> object:
        calls.append(u)
        if len(calls) == 1:
            real(u, existing)  # the other process got there first
            raise sqlalchemy.exc.OperationalError("CREATE TABLE alembic_version", {}, Exception(message))
        return real(u, existing)

    monkeypatch.setattr(storage_mod, "_rdb_storage", racing)
    st = storage_mod.make_storage(url)
    assert len(calls) == 2 and st.get_all_studies() == []
