"""Real searches on the CPU backend: resume, kill -9 recovery, and two workers on PostgreSQL.

Every search here runs the real `tuner` CLI in a child process against the session's real CPU build
(tests/conftest.py ``cpu_build``; cached in TUNER_HOME) and the ``tiny`` model, with small depths so
a trial takes seconds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SMALL = ["--variant", "cpu", "--depths", "0,256", "--pp", "32", "--tg", "8", "--min-rounds", "2", "--max-rounds", "2"]


def finished(study) -> dict[int, tuple[str, object]]:
    return {t.number: (t.state.name, t.values) for t in study.trials if t.state.is_finished()}


def test_search_then_rerun_resumes_without_remeasuring(
    cpu_build, tiny_model, tuner_home: Path, tmp_path: Path, tuner, load
) -> None:
    run = tmp_path / "run"
    args = ["search", *SMALL, "--model", str(tiny_model), "--run-dir", str(run), "--study", "resume"]
    first = tuner(*args, "--trials", "1", "--reps-pp", "2", "--reps-tg", "2", home=tuner_home)
    assert "Screen tg" in first.stderr and "Result:" in first.stdout
    # prefill and decode share each llama-bench process (one depth fill per depth for both tests)
    shared = sorted((run / "logs").glob("screen-tg+pp-*-pp+tg.log"))
    assert len(shared) == 4 and not list((run / "logs").glob("screen-*-pp.log"))
    assert " -p 32 -n 8 -d 0,256 -r 3 " in shared[0].read_text().splitlines()[0]  # --reps 2 kept + 1 discarded
    assert (run / "export" / "config.toml").is_file() and (run / "export" / "report.md").is_file()
    # seed 004 §21.1: the screen's decode cells carry CPU% of the timed repetitions, reported and plotted
    screen = (run / "export" / "report.md").read_text().split("## Kernel screen", 1)[1]  # not a dropped trial's rows
    screen_d0 = next(ln for ln in screen.splitlines() if ln.startswith("| tg@d0 "))
    cpu_up = screen_d0.split("|")[4].strip()
    assert cpu_up != "—" and 10 < float(cpu_up) < 400, screen_d0
    storage = f"sqlite:///{run / 'study.db'}"
    st1 = load(storage, "resume")
    from tuner.result.pipeline_export import pareto_differs, pareto_points
    from tuner.study.record import outcome_from_attrs

    # The decode Pareto plot is drawn only where some config moves t/s or CPU% beyond the noise.
    png = run / "export" / "pareto_decode.png"
    assert pareto_points(outcome_from_attrs(st1.user_attrs))  # CPU% was measured
    if pareto_differs(outcome_from_attrs(st1.user_attrs)):
        assert png.stat().st_size > 10_000
    else:
        assert not png.exists()
    rounds = st1.user_attrs["screen_rounds"]
    # CPU: nothing to force, so each phase is upstream against its A/A twin, two rounds each
    assert sorted((r["phase"], r["order"][0]) for r in rounds) == [
        ("pp", "upstream"),
        ("pp", "upstream-aa"),
        ("tg", "upstream"),
        ("tg", "upstream-aa"),
    ]
    assert st1.user_attrs["result"]["rules"] == [] and len(st1.trials) == 1
    from tuner._compat import tomllib

    gate = tomllib.loads((run / "export" / "config.toml").read_text())["gate"]
    if st1.user_attrs["result"]["tuned"] is None:  # upstream's config: nothing to compare, nothing run
        assert gate["verdict"] == "not needed" and gate["modes"] == [] and "upstream" in gate["why"]
    else:  # the timing confirmed a process knob: the real gate ran on it
        assert gate["verdict"] == "pass" and gate["mean_kld"] <= gate["thresholds"]["mean_kld"] and gate["checks"]
    assert "## Output-equivalence gate" in (run / "export" / "report.md").read_text()

    second = tuner(*args, "--trials", "2", home=tuner_home)
    st2 = load(storage, "resume")
    assert st2.user_attrs["screen_rounds"] == rounds  # the finished screen is not measured again
    assert "Screen tg" not in second.stderr
    assert len(st2.trials) == 2 and finished(st2)[0] == finished(st1)[0]  # one more tune trial, none redone
    assert st2.trials[1].user_attrs["status"] in ("ok", "failed", "infeasible")


def test_kill_9_then_rerun_continues(cpu_build, tiny_model, tuner_home: Path, tmp_path: Path, tuner, load) -> None:
    run = tmp_path / "run"
    storage = f"sqlite:///{run / 'study.db'}"
    args = [
        sys.executable,
        "-m",
        "tuner",
        "search",
        *SMALL[:-4],
        "--min-rounds",
        "3",
        "--max-rounds",
        "3",
        "--model",
        str(tiny_model),
        "--run-dir",
        str(run),
        "--study",
        "killed",
        "--trials",
        "1",
    ]
    env = {**os.environ, "TUNER_HOME": str(tuner_home)}
    out = (tmp_path / "search.log").open("w")
    proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            time.sleep(0.5)
            if proc.poll() is not None:  # ended before it could be killed: say why instead of waiting out the deadline
                pytest.fail(
                    f"the search exited ({proc.returncode}) before two screen rounds were recorded:\n"
                    + (tmp_path / "search.log").read_text()[-3000:]
                )
            if (run / "study.db").is_file():
                try:
                    st = load(storage, "killed")
                except Exception:
                    continue
                if len(st.user_attrs.get("screen_rounds", [])) >= 2:
                    break
        else:
            pytest.fail("the search never finished a screen round")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # kill -9 the search and its llama-bench children
        proc.wait()
        out.close()
    before = load(storage, "killed").user_attrs["screen_rounds"]
    assert "result" not in load(storage, "killed").user_attrs
    time.sleep(1)
    tuner(*args[3:], home=tuner_home)
    st = load(storage, "killed")
    after = st.user_attrs["screen_rounds"]
    assert after[: len(before)] == before  # no finished round lost or redone
    assert sorted(r["phase"] for r in after).count("tg") == 3 and sorted(r["phase"] for r in after).count("pp") == 3
    assert "result" in st.user_attrs and not [t for t in st.trials if t.state.name in ("RUNNING", "WAITING")]


# ------------------------------------------------------------------------- PostgreSQL, two workers (the postgres fixture: conftest.py)


@pytest.mark.postgres
def test_two_workers_share_a_postgres_study(
    cpu_build, tiny_model, tuner_home: Path, tmp_path: Path, postgres: str, tuner, load
) -> None:
    common = [*SMALL, "--model", str(tiny_model), "--storage", postgres, "--study", "shared"]
    # `tuner search` screens and composes; then two workers on "other hosts" add tune trials.
    tuner("search", *common, "--trials", "1", "--run-dir", str(tmp_path / "lead"), home=tuner_home)
    env = {**os.environ, "TUNER_HOME": str(tuner_home)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tuner", "worker", *common, "--trials", "6", "--run-dir", str(tmp_path / f"w{i}")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    st = load(postgres, "shared")
    states = [t.state.name for t in st.trials]
    assert len(st.trials) >= 6 and not [s for s in states if s in ("RUNNING", "WAITING")]
    assert all("[trial " in err for _, err in outs)  # both workers really worked on the shared study
    for t in st.trials:  # every trial is accounted for: measured, or failed/infeasible with a reason
        assert t.user_attrs.get("status"), (t.number, t.state, t.user_attrs)
    # the lead's screen is shared, not repeated by the workers
    assert all("Screen" not in err for _, err in outs)
