"""Real searches on the CPU backend: resume, kill -9 recovery, and two workers on PostgreSQL.

Every search here runs the real `tuner` CLI in a child process against the session's real CPU build
(tests/conftest.py ``cpu_build``; cached in TUNER_HOME) and the ``tiny`` model, with small depths so
a trial takes seconds.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SMALL = ["--variant", "cpu", "--depths", "0,256", "--pp", "32", "--tg", "8", "--max-reps", "4", "--target-ci", "20"]


def tuner(*args: str, home: Path, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TUNER_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    res = subprocess.run([sys.executable, "-m", "tuner", *args], env=env, capture_output=True, text=True,
                         timeout=timeout)
    if check:
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res


def load(storage: str, study: str):
    """A snapshot of the study (trials, user attrs); the DB connection is closed before returning."""
    import types

    import optuna

    rdb = optuna.storages.RDBStorage(storage)
    try:
        st = optuna.load_study(study_name=study, storage=rdb)
        return types.SimpleNamespace(trials=st.get_trials(deepcopy=True), user_attrs=dict(st.user_attrs))
    finally:
        rdb.engine.dispose()


def finished(study) -> dict[int, tuple[str, object]]:
    return {t.number: (t.state.name, t.value) for t in study.trials if t.state.is_finished()}


def test_search_then_rerun_resumes_without_rebuilding(cpu_build, tiny_model, tuner_home: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = ["search", *SMALL, "--model", str(tiny_model), "--run-dir", str(run), "--study", "resume"]
    first = tuner(*args, "--trials", "3", home=tuner_home)
    assert "Done: 3 trials" in first.stderr
    assert (run / "export" / "config.toml").is_file() and (run / "export" / "report.md").is_file()
    storage = f"sqlite:///{run / 'study.db'}"
    before = finished(load(storage, "resume"))
    assert len(before) == 3 and load(storage, "resume").user_attrs["anchors"]

    second = tuner(*args, "--trials", "5", home=tuner_home)
    st = load(storage, "resume")
    after = finished(st)
    assert len(st.trials) == 5 and all(after[n] == before[n] for n in before)  # nothing lost or redone
    assert "builds 0 new" in second.stderr  # the build is served from the cache
    # the first trial is the enqueued upstream default (search_spaces/cpu.toml defaults)
    assert st.trials[0].params == {"threads": 2, "ubatch": 512, "flash_attn": "on"}
    assert st.trials[0].user_attrs["args"] == ["-t", "2", "-ub", "512", "-fa", "on"]


def test_kill_9_then_rerun_continues(cpu_build, tiny_model, tuner_home: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    storage = f"sqlite:///{run / 'study.db'}"
    args = [sys.executable, "-m", "tuner", "search", *SMALL, "--model", str(tiny_model), "--run-dir", str(run),
            "--study", "killed", "--trials", "6"]
    env = {**os.environ, "TUNER_HOME": str(tuner_home)}
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            time.sleep(1)
            if (run / "study.db").is_file():
                try:
                    st = load(storage, "killed")
                except Exception:  # noqa: BLE001 - study not created yet
                    continue
                if len(finished(st)) >= 2 and any(t.state.name == "RUNNING" for t in st.trials):
                    break
        else:
            pytest.fail("the search never reached a running trial")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # kill -9 the search and its llama-bench children
        proc.wait()
    killed = finished(load(storage, "killed"))
    time.sleep(1)
    res = tuner(*args[3:], home=tuner_home)
    st = load(storage, "killed")
    assert all(finished(st)[n] == killed[n] for n in killed)  # no finished trial lost
    assert "builds 0 new" in res.stderr
    assert not [t for t in st.trials if t.state.name in ("RUNNING", "WAITING")]  # every trial accounted for
    assert len([t for t in st.trials if t.state.name != "FAIL"]) >= 6 - 1


# ------------------------------------------------------------------------- PostgreSQL, two workers


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


@pytest.mark.postgres
def test_two_workers_share_a_postgres_study(cpu_build, tiny_model, tuner_home: Path, tmp_path: Path,
                                            postgres: str) -> None:
    common = [*SMALL, "--model", str(tiny_model), "--storage", postgres, "--study", "shared"]
    # `tuner search` creates the study and measures the baseline; then two workers on "other hosts".
    tuner("search", *common, "--trials", "1", "--run-dir", str(tmp_path / "lead"), home=tuner_home)
    env = {**os.environ, "TUNER_HOME": str(tuner_home)}
    procs = [
        subprocess.Popen([sys.executable, "-m", "tuner", "worker", *common, "--trials", "8",
                          "--run-dir", str(tmp_path / f"w{i}")], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for i in range(2)
    ]
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    st = load(postgres, "shared")
    states = [t.state.name for t in st.trials]
    assert len(st.trials) >= 8 and not [s for s in states if s in ("RUNNING", "WAITING")]
    # both workers really worked on the shared study
    assert all("[trial " in err for _, err in outs)
    # every trial is accounted for: measured, pruned with its points, or failed with a reason
    for t in st.trials:
        assert t.user_attrs.get("status") or t.state.name == "COMPLETE", (t.number, t.state, t.user_attrs)
    # no variant was built twice: every worker found the one CPU build in the shared cache
    assert all("builds 0 new" in err for _, err in outs)
