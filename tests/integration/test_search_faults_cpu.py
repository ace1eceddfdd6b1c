"""Real `tuner search` runs on the CPU build under hostile input and faults: a truncated model, two
searches on one run dir, SIGTERM during a tune trial, storage URLs that would lose the study, and a
storage password that must appear in nothing tuner prints or writes.

Each search is the real CLI in a child process on the session's cached CPU build and the ``tiny``
model at the cheapest settings (two depths, two rounds, TUNER_TRIALS=0 where no trial is needed).
"""

from __future__ import annotations

import contextlib
import datetime
import lzma
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SMALL = ["--variant", "cpu", "--depths", "0,256", "--pp", "32", "--tg", "8", "--min-rounds", "2", "--max-rounds", "2"]
REPO = Path(__file__).resolve().parents[2]
RULE = "decode/D64/gqa4/kvf16:65536-=TILE"


def test_a_truncated_model_stops_the_search_with_llama_benchs_error(
    cpu_build, tiny_model, tuner_home: Path, tmp_path: Path, tuner, load
) -> None:
    bad = tmp_path / "tiny-half.gguf"
    data = tiny_model.read_bytes()
    bad.write_bytes(data[: len(data) // 2])  # the GGUF header and metadata are intact: the shape reads fine
    run = tmp_path / "run"
    res = tuner(
        "search",
        *SMALL,
        "--model",
        str(bad),
        "--run-dir",
        str(run),
        "--study",
        "trunc",
        "--trials",
        "0",
        home=tuner_home,
        check=False,
    )
    assert res.returncode == 1, res.stderr[-3000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith(f"tuner: error: llama-bench cannot run the model {bad}")
    assert "failed to load model" in last and "truncated or corrupt" in last  # llama-bench's own words, and the fix
    assert "Result:" not in res.stdout and "upstream's selection" not in res.stdout + res.stderr
    assert not (run / "export").exists()
    st = load(f"sqlite:///{run / 'study.db'}", "trunc")
    assert not st.user_attrs.get("screen_rounds") and "result" not in st.user_attrs  # nothing of it stored


def _wait(pred, proc: subprocess.Popen, log: Path, what: str, limit: float = 600) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if pred():
            return
        if proc.poll() is not None:
            pytest.fail(f"the search exited ({proc.returncode}) before {what}:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


def test_second_search_refuses_then_sigterm_in_a_trial_and_resume_reach_the_count(
    cpu_build, tiny_model, tuner_home: Path, tmp_path: Path, tuner, load
) -> None:
    from tuner.search import tune as tn
    from tuner.search.lock import read_owner

    run = tmp_path / "run"
    storage = f"sqlite:///{run / 'study.db'}"
    args = ["search", *SMALL, "--model", str(tiny_model), "--run-dir", str(run), "--study", "sig", "--trials", "2"]
    env = {**os.environ, "TUNER_HOME": str(tuner_home), "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "first.log"
    with log.open("w") as out:
        first = subprocess.Popen(
            [sys.executable, "-m", "tuner", *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait(lambda: read_owner(run).get("pid") == first.pid, first, log, "it took the run dir's lock", 120)
        # 4. a second search on the same run dir refuses at once, naming the first
        t0 = time.monotonic()
        second = tuner(*args, home=tuner_home, check=False, timeout=120)
        assert second.returncode == 1 and time.monotonic() - t0 < 60, second.stderr[-2000:]
        assert f"PID {first.pid}" in second.stderr and "--run-dir" in second.stderr and "Screen" not in second.stderr

        # 3. SIGTERM while a tune trial runs (to the process group, as a service manager or Ctrl-C would)
        def running() -> bool:
            with contextlib.suppress(Exception):
                return any(t.state.name == "RUNNING" for t in load(storage, "sig").trials)
            return False

        _wait(running, first, log, "a tune trial started")
        assert first.poll() is None, f"the search ended before the signal:\n{log.read_text()[-3000:]}"
        os.killpg(first.pid, signal.SIGTERM)
        rc = first.wait(timeout=120)
        assert rc == 130, f"exit {rc} after SIGTERM; its output:\n{log.read_text()[-3000:]}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    text = log.read_text()
    assert "Rerun the same command to resume" in text and "tuner: aborted" in text
    st = load(storage, "sig")
    cut = [t for t in st.trials if t.user_attrs.get("status") == "interrupted"]
    assert cut and cut[0].state.name == "FAIL" and read_owner(run) == {}  # lock released on the way out

    again = tuner(*args, home=tuner_home)
    assert "Result:" in again.stdout
    import optuna

    rdb = optuna.storages.RDBStorage(storage, skip_table_creation=True)
    try:
        study = optuna.load_study(study_name="sig", storage=rdb)
        assert tn.count_done(study) == 2  # the count asked for: the cut-off trial does not count, its re-run does
        retried = [t for t in study.trials if t.user_attrs.get("retry_of") == cut[0].number]
        assert retried and retried[0].params == cut[0].params and retried[0].state.name in ("COMPLETE", "FAIL")
        assert not [t for t in study.trials if t.state.name in ("RUNNING", "WAITING")]
    finally:
        rdb.engine.dispose()


def test_storage_and_pins_are_refused_before_anything_is_created(
    cpu_build, tiny_model, tuner_home: Path, tmp_path: Path, tuner
) -> None:
    base = ["search", *SMALL, "--model", str(tiny_model), "--trials", "0"]
    missing = tmp_path / "nonexistent-dir"
    for extra, want in (
        (["--storage", "sqlite:///"], "in memory"),
        (["--storage", f"sqlite:///{missing / 'x.db'}"], f"mkdir -p {missing}"),
        (["--storage", "postgres://u:pw@h:notaport/db"], "does not parse"),
        (["--set", "variant=bogus"], "is not a variant"),
    ):
        run = tmp_path / f"run-{len(extra[1])}"
        res = tuner(*base, "--run-dir", str(run), *extra, home=tuner_home, check=False, timeout=300)
        assert res.returncode == 2 and want in res.stderr, (extra, res.stderr[-2000:])
        assert len(res.stderr.strip().splitlines()[-1]) > 40 and "pw@" not in res.stderr  # one paragraph, no password
        assert not run.exists() and not missing.exists()  # no run dir, no study.db, no folder made unasked


def _grep_tree(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


@pytest.mark.postgres
def test_a_storage_password_is_in_nothing_tuner_prints_or_writes(
    cpu_build, tiny_model, tuner_home: Path, tmp_path: Path, postgres: str, tuner
) -> None:
    secret = "Pw-9f3kq7x"
    url = postgres.replace("://tuner@", f"://tuner:{secret}@")  # the test server trusts; the password rides along
    logs = tuner_home / "logs"
    crash_before = {p: p.read_bytes() for p in logs.glob("*")} if logs.is_dir() else {}
    # a server that refuses: the storage error is printed with the password hidden
    refused = tuner(
        "search",
        *SMALL,
        "--model",
        str(tiny_model),
        "--storage",
        "postgresql+psycopg://tuner:" + secret + "@127.0.0.1:1/tuner",
        "--study",
        "nope",
        "--run-dir",
        str(tmp_path / "nope"),
        "--trials",
        "0",
        home=tuner_home,
        check=False,
        timeout=300,
    )
    assert refused.returncode == 2 and "cannot open the study storage" in refused.stderr, refused.stderr[-2000:]
    assert "tuner:***@127.0.0.1:1" in refused.stderr
    # a full real search and its export on PostgreSQL
    run = tmp_path / "run"
    res = tuner(
        "search",
        *SMALL,
        "--model",
        str(tiny_model),
        "--storage",
        url,
        "--study",
        "secret",
        "--run-dir",
        str(run),
        "--trials",
        "0",
        "--time-budget",
        "3600",
        home=tuner_home,
    )
    assert "Result:" in res.stdout and (run / "export" / "report.md").is_file()
    assert "in postgresql+psycopg://tuner:***@127.0.0.1" in res.stderr  # the study line names the storage, redacted
    assert (
        "optuna-dashboard postgresql+psycopg://tuner@127.0.0.1" in res.stderr
    )  # the hint: the password from PGPASSWORD
    # a budget stop and a crash on the same storage print it too
    cut = tuner(
        "search",
        *SMALL,
        "--model",
        str(tiny_model),
        "--storage",
        url,
        "--study",
        "secret2",
        "--run-dir",
        str(tmp_path / "run2"),
        "--trials",
        "0",
        "--time-budget",
        "1",
        home=tuner_home,
        check=False,
    )
    assert cut.returncode == 3 and "time budget reached" in cut.stderr and "tuner:***@" in cut.stderr
    every = refused.stdout + refused.stderr + res.stdout + res.stderr + cut.stdout + cut.stderr
    assert secret not in every
    written = _grep_tree(tmp_path, secret.encode())
    assert written == [], written
    if logs.is_dir():  # crash logs under TUNER_HOME, old and new
        assert not [p for p in logs.glob("*") if secret.encode() in p.read_bytes() and p not in crash_before]


def _pg_server(url: str) -> tuple[list[str], str, str]:
    """How to stop and start the ``postgres`` fixture's server again: the command prefix it runs as,
    its data folder and the start options (asked from the server itself)."""
    import shutil

    import psycopg

    plain = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(plain, autocommit=True) as c:
        data = c.execute("SHOW data_directory").fetchone()[0]
        sock = c.execute("SHOW unix_socket_directories").fetchone()[0]
        port = c.execute("SHOW port").fetchone()[0]
    pg_ctl = next(
        (str(d / "pg_ctl") for d in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)),
        shutil.which("pg_ctl") or "pg_ctl",
    )
    run_as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    return [*run_as, pg_ctl, "-D", data], f"-p {port} -k {sock} -c listen_addresses=127.0.0.1", str(Path(data).parent)


def _running_trials(url: str, study: str) -> int:
    import psycopg

    with contextlib.suppress(psycopg.Error), psycopg.connect(url.replace("+psycopg", ""), connect_timeout=5) as c:
        row = c.execute(
            "SELECT count(*) FROM trials t JOIN studies s ON s.study_id = t.study_id "
            "WHERE s.study_name = %s AND t.state = 'RUNNING'",
            (study,),
        ).fetchone()
        return int(row[0]) if row else 0
    return 0


@pytest.mark.postgres
def test_postgres_stopping_mid_trial_is_one_error_and_the_trial_runs_again(
    cpu_build, tiny_model, tuner_home: Path, tmp_path: Path, postgres: str, tuner, load
) -> None:
    """The server stops while a tune trial runs: exit 1 'lost the study storage' in one paragraph (no
    thread tracebacks, not exit 70); started again, the same command fails that trial and runs it again."""
    ctl, opts, base = _pg_server(postgres)
    args = ["search", *SMALL, "--model", str(tiny_model), "--storage", postgres, "--study", "lost"]
    args += ["--run-dir", str(tmp_path / "run"), "--trials", "3", "--reps-tg", "6"]  # trials of seconds, not one
    env = {**os.environ, "TUNER_HOME": str(tuner_home), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuner", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    stopped = False
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            if _running_trials(postgres, "lost"):
                subprocess.run([*ctl, "-m", "fast", "-w", "stop"], check=True, capture_output=True)
                stopped = True
                break
            time.sleep(0.2)
        _, err = proc.communicate(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        if stopped:
            subprocess.run([*ctl, "-l", f"{base}/log", "-w", "-o", opts, "start"], check=True, capture_output=True)
    assert stopped, f"no tune trial was seen running (exit {proc.returncode}):\n{err[-3000:]}"
    assert proc.returncode == 1, err[-3000:]
    assert "Traceback" not in err and "Exception in thread" not in err and "internal error" not in err, err[-3000:]
    errors = [ln for ln in err.splitlines() if ln.startswith("tuner: error:")]
    assert len(errors) == 1 and errors[0].startswith("tuner: error: lost the study storage postgresql+psycopg://")
    assert err.rstrip().endswith(errors[0])  # the last thing printed, nothing after it
    left = [t for t in load(postgres, "lost").trials if t.state.name == "RUNNING"]
    assert len(left) == 1  # nobody could mark it: the next search does
    if "worker" not in left[0].user_attrs:  # the server stopped inside ask (sampling), before the trial named its
        # worker: nothing tells its process is gone, so it is failed once older than the heartbeat's grace period
        from tuner.study.storage import GRACE_S

        time.sleep(max(0.0, GRACE_S + 2 - (datetime.datetime.now() - left[0].datetime_start).total_seconds()))
    # the server is back: the same command resumes, fails the cut-off trial and runs its parameters again
    again = tuner(*args, home=tuner_home, timeout=900)
    st = load(postgres, "lost")
    cut = next(t for t in st.trials if t.number == left[0].number)
    assert cut.state.name == "FAIL"

    # a trial cut inside ask has only the values sampled before the cut: its retry repeats those, samples the rest
    def repeats(t: object) -> bool:
        return all(t.params.get(k) == v for k, v in cut.params.items())  # type: ignore[attr-defined]

    if "were cut off by an interrupted search or worker" in again.stderr:  # tuner's own reaping
        assert cut.user_attrs["status"] == "interrupted"
        assert any(t.user_attrs.get("retry_of") == cut.number and repeats(t) for t in st.trials)
    else:  # a loaded machine let the heartbeat's grace period pass first: Optuna's stale-trial retry ran it again
        assert any(t.number > cut.number and repeats(t) for t in st.trials)
    assert not [t for t in st.trials if t.state.name in ("RUNNING", "WAITING")] and "result" in st.user_attrs


@pytest.mark.postgres
def test_export_and_worker_check_the_storage_as_search_does(tmp_path: Path, postgres: str, tuner) -> None:
    """A database that does not exist on a real server, and one that holds no study: exit 2 naming it (it
    was exit 70 for export), before the worker fetches or builds anything; the empty database stays empty."""
    import psycopg

    home = tmp_path / "home"
    nodb = postgres.rsplit("/", 1)[0] + "/nosuchdb"
    plain = postgres.replace("+psycopg", "")
    with psycopg.connect(plain, autocommit=True) as c:
        c.execute("CREATE DATABASE emptydb")
    empty = postgres.rsplit("/", 1)[0] + "/emptydb"
    for url, want in ((nodb, 'database "nosuchdb" does not exist'), (empty, "holds no Optuna study")):
        for cmd in (["export", "-o", str(tmp_path / "out")], ["worker", "--arch", "cpu"]):
            res = tuner(*cmd, "--storage", url, "--study", "s", home=home, check=False, timeout=120)
            assert res.returncode == 2 and want in res.stderr and "internal error" not in res.stderr, res.stderr
            assert not (tmp_path / "out").exists() and not (home / "sources").exists()
    with psycopg.connect(plain.rsplit("/", 1)[0] + "/emptydb") as c:
        assert c.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone() == (0,)


def test_export_redacts_the_storage_and_refuses_a_nan_result(tree_a, tmp_path: Path) -> None:
    """PR.md (written only for GPU rules, so not by a CPU search) names no storage, and the export's NaN
    guard, on the stored H100 study with test_pipeline_export's CRAFTED confirm rows."""

    import optuna

    from tuner.cli.export_cmd import export_study
    from tuner.errors import TunerError
    from tuner.plan.fa_rules import parse_fa_rules
    from tuner.result.pipeline_export import _write_upstream
    from tuner.result.pipeline_report import confirmed_points
    from tuner.study.record import StudyHeader

    h = StudyHeader(
        name="sm90",
        arch="sm_90",
        model="/m/Llama-3.2-1B.gguf",
        depths=(32768, 49152, 65536),
        pp=512,
        tg=128,
        device="NVIDIA H100 80GB HBM3",
        commit=tree_a.commit,
    )
    rows = _crafted_rows()
    _write_upstream(tmp_path, tree_a, h, parse_fa_rules(RULE), confirmed_points(rows, 512, 128), defines={})
    pr = (tmp_path / "PR.md").read_text()
    # PR.md's reproduce steps are stock llama.cpp's and 'tuner export --study STUDY': they name no storage at all
    # (a reader has none of the author's databases)
    assert "--storage" not in pr and "postgresql" not in pr and "tuner export --study STUDY" in pr
    assert f"git checkout {tree_a.commit}" in pr

    db = tmp_path / "study.db"
    db.write_bytes(lzma.decompress((REPO / "docs" / "data" / "noise-floors" / "sm90-l1b-v2.db.xz").read_bytes()))
    storage = f"sqlite:///{db}"
    rows[2] = {**rows[2], "tuned_ts": float("nan")}  # every call of the final config failed at that depth
    optuna.load_study(study_name="sm90-l1b-v2", storage=storage).set_user_attr(
        "result",
        {
            "rules": [RULE],
            "dropped": {},
            "tuned": None,
            "rows": rows,
            "upstream_phases": ["pp"],
            "confirm_depths": [32768, 49152, 65536],
            "gate": _PASSED_GATE,
        },
    )
    with pytest.raises(TunerError, match=r"rows\[2\]\.tuned_ts .*not exported"):
        export_study("sm90-l1b-v2", storage=storage, out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _crafted_rows() -> list[dict]:
    """Confirm rows shaped like tuner.search.confirm.point_rows' (CRAFTED numbers: the export is tested)."""
    return [
        {
            "phase": "tg",
            "depth": d,
            "upstream_kernel": "VEC",
            "kernel": "TILE" if d >= 65536 else "VEC",
            "base_ts": up,
            "tuned_ts": tuned,
            "speedup": tuned / up,
            "ci_low": lo,
            "ci_high": hi,
            "rounds": 4,
            "aa_noise_pct": 4.4,
            "verdict": v,
        }
        for d, up, tuned, lo, hi, v in (
            (32768, 561.0, 563.0, 0.99, 1.02, "no difference"),
            (49152, 480.0, 481.0, 0.99, 1.02, "no difference"),
            (65536, 402.6, 461.0, 1.11, 1.18, "faster"),
        )
    ]


_PASSED_GATE = {
    "verdict": "pass",
    "checks": [
        {  # CRAFTED, shaped like tuner.rounds.output_gate's record
            "name": "decode decode/D64/gqa4/kvf16:0-=TILE",
            "mode": "decode",
            "strict": False,
            "passed": True,
            "verdict": "pass",
            "reasons": [],
            "deterministic": True,
            "identical_to_upstream": False,
            "why": "kept rule kernel TILE",
            "stats": {"mean_kld": 0.0, "p99_kld": 1e-6, "max_kld": 2e-6, "same_top_pct": 100.0},
            "thresholds": {"mean_kld": 1e-5, "p99_kld": 1e-4, "same_top_pct": 98.0},
            "settings": {"ctx": 128, "chunks": 2},
        }
    ],
}
