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
def postgres():
    """A real PostgreSQL server (Debian package `postgresql`) on 127.0.0.1, started for these tests."""
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not (initdb and pg_ctl):
        if os.geteuid() == 0 and shutil.which("apt-get"):
            subprocess.run(["apt-get", "update"], check=False, capture_output=True)
            subprocess.run(["apt-get", "install", "-y", "-q", "postgresql"], check=False, capture_output=True,
                           env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
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
    subprocess.run([*run_as, pg_ctl, "-D", str(data), "-l", str(base / "log"), "-w", "-o",
                    f"-p {port} -k {sock} -c listen_addresses=127.0.0.1", "start"], check=True, capture_output=True)
    try:
        import psycopg

        with psycopg.connect(f"postgresql://tuner@127.0.0.1:{port}/postgres", autocommit=True) as c:
            c.execute("CREATE DATABASE tuner")
        yield f"postgresql+psycopg://tuner@127.0.0.1:{port}/tuner"
    finally:
        subprocess.run([*run_as, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
