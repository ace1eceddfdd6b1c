"""Fixtures shared by integration test modules."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest


def _pg_bin(name: str) -> str | None:
    for d in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (d / name).is_file():
            return str(d / name)
    return shutil.which(name)


@pytest.fixture(scope="module")
def postgres(pytestconfig: pytest.Config):
    """A real PostgreSQL server (Debian package `postgresql`) on 127.0.0.1, started for these tests."""
    from tests.conftest import NO_INSTALL, no_install, say

    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not (initdb and pg_ctl):
        if no_install():
            pytest.skip(f"PostgreSQL server binaries not found, and {NO_INSTALL} is set (apt-get install postgresql)")
        if os.geteuid() == 0 and shutil.which("apt-get"):
            say(
                pytestconfig,
                "installing the PostgreSQL server for the shared-study tests: apt-get update && apt-get install -y "
                f"postgresql (system-wide, as root); {NO_INSTALL}=1 skips these tests instead",
            )
            subprocess.run(["apt-get", "update"], check=False, capture_output=True)
            subprocess.run(
                ["apt-get", "install", "-y", "-q", "postgresql"],
                check=False,
                capture_output=True,
                env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
            )
            initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
        if not (initdb and pg_ctl):
            pytest.skip("PostgreSQL server binaries not found (apt-get install postgresql)")
    import tempfile

    # Not under pytest's tmp dir: that is private to root (0700) and the server runs as `postgres`.
    base = Path(tempfile.mkdtemp(prefix="tuner-pg-"))
    base.chmod(0o755)
    data, sock = base / "data", base / "sock"
    sock.mkdir()
    run_as: list[str] = []
    if os.geteuid() == 0:  # postgres refuses to run as root
        shutil.chown(base, "postgres")
        shutil.chown(sock, "postgres")
        run_as = ["runuser", "-u", "postgres", "--"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    subprocess.run([*run_as, initdb, "-D", str(data), "-U", "tuner", "--auth=trust"], check=True, capture_output=True)
    subprocess.run(
        [
            *run_as,
            pg_ctl,
            "-D",
            str(data),
            "-l",
            str(base / "log"),
            "-w",
            "-o",
            f"-p {port} -k {sock} -c listen_addresses=127.0.0.1",
            "start",
        ],
        check=True,
        capture_output=True,
    )
    try:
        import psycopg

        with psycopg.connect(f"postgresql://tuner@127.0.0.1:{port}/postgres", autocommit=True) as c:
            c.execute("CREATE DATABASE tuner")
        yield f"postgresql+psycopg://tuner@127.0.0.1:{port}/tuner"
    finally:
        subprocess.run([*run_as, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def tuner():
    """``tuner(*args, home=...)``: the real CLI in a child process (``python -m tuner``) with that TUNER_HOME;
    asserts exit 0 unless ``check=False``."""
    import sys

    def run(*args: str, home: Path, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "TUNER_HOME": str(home), "PYTHONUNBUFFERED": "1"}
        res = subprocess.run(
            [sys.executable, "-m", "tuner", *args], env=env, capture_output=True, text=True, timeout=timeout
        )
        if check:
            assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        return res

    return run


@pytest.fixture(scope="session")
def load():
    """``load(storage, study)``: a snapshot of the study (trials, user attrs), its connection closed."""
    import types

    def snapshot(storage: str, study: str) -> types.SimpleNamespace:
        import optuna

        # skip_table_creation: polling a study a child is still creating must not race its DDL (a second
        # create_all on a fresh SQLite file made the child exit early, and the kill -9 test then waited forever)
        rdb = optuna.storages.RDBStorage(storage, skip_table_creation=True)
        try:
            st = optuna.load_study(study_name=study, storage=rdb)
            return types.SimpleNamespace(trials=st.get_trials(deepcopy=True), user_attrs=dict(st.user_attrs))
        finally:
            rdb.engine.dispose()

    return snapshot
