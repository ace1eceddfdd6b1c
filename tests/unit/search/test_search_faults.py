"""`tuner search` under faults: a model no llama-bench call can load, an interrupted tune trial, two
searches on one run dir, storage URLs that would lose the study or create folders unasked."""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path
from typing import Any

import pytest

from tuner.errors import TunerError, UsageError
from tuner.rounds.joint import AllCallsFailed, candidates_for, run_joint_rounds, run_phase_rounds
from tuner.sanity import nonfinite, require_finite

REPO = Path(__file__).resolve().parents[3]


# ------------------------------------------------------------------ every llama-bench call fails

LOAD_ERR = (
    "llama-bench exited with code 1; see /run/logs/screen-tg+pp-r0-upstream.log. Last lines: "
    "llama_model_load: error loading model: tensor 'blk.1.attn_q.weight' data is not within the file bounds | "
    "error: failed to load model '/m/tiny.gguf'"
)


def failing_joint(c, phases, depths, label):
    """llama-bench on a truncated model: every call fails before it measures anything."""
    return {p: {d: {"ts": None, "kernel": None, "why": None, "error": LOAD_ERR} for d in depths} for p in phases}


def test_a_stage_where_every_call_fails_stops() -> None:
    cands = {"tg": candidates_for("tg", []), "pp": candidates_for("pp", [])}
    rounds: list = []
    stored: list = []
    with pytest.raises(AllCallsFailed) as e:
        run_joint_rounds(
            failing_joint, cands, [0, 256], rounds, pp_tokens=32, min_rounds=2, max_rounds=2, on_round=stored.append
        )
    assert isinstance(e.value, TunerError) and e.value.exit_code == 1
    assert "failed to load model" in str(e.value) and "all 2 llama-bench call(s)" in str(e.value)
    assert rounds == [] and stored == []  # nothing of the failed round is kept: a rerun measures it again
    # the confirm stage's loop is the same: a single phase that measures nothing stops it too
    with pytest.raises(AllCallsFailed):
        run_phase_rounds(
            lambda c, p, ds, lab: failing_joint(c, [p], ds, lab)[p],
            "tg",
            candidates_for("tg", []),
            [0],
            [],
            tag="confirm",
        )


def test_a_build_that_dies_of_sigill_is_named_and_not_blamed_on_the_model() -> None:
    # The last CI run's main job: a cached -march=native build from another CPU; llama-bench logs nothing
    # before the signal, so the stop's text must carry the crash hint, not "the model is corrupt".
    from tuner.targets.host import crash_hint

    cmd = ["/home/builds/x/bin/llama-bench", "-m", "/m/tiny.gguf"]
    err = (
        "llama-bench exited with code -4; see /nonexistent/screen.log. Last lines: $ llama-bench -m /m/tiny.gguf\n"
        "llama-bench: benchmark 1/4: warmup prompt run" + crash_hint(-4, cmd)
    )
    with pytest.raises(AllCallsFailed) as e:
        run_joint_rounds(
            lambda c, phases, depths, label: {
                p: {d: {"ts": None, "kernel": None, "why": None, "error": err} for d in depths} for p in phases
            },
            {"tg": candidates_for("tg", []), "pp": candidates_for("pp", [])},
            [0],
            [],
            pp_tokens=32,
            min_rounds=2,
            max_rounds=2,
        )
    assert e.value.crash.startswith("llama-bench was killed by SIGILL") and "$TUNER_HOME/builds/" in e.value.crash


def test_a_call_failing_beside_one_that_measures_is_data() -> None:
    def half(c, phases, depths, label):  # the deep depth runs out of memory, the shallow one measures
        return {
            p: {
                d: (
                    {"ts": 100.0, "kernel": None, "why": None, "error": ""}
                    if d == 0
                    else {"ts": None, "kernel": None, "why": None, "error": "out of memory"}
                )
                for d in depths
            }
            for p in phases
        }

    rounds: list = []
    run_joint_rounds(
        half, {"tg": candidates_for("tg", [])}, [0, 65536], rounds, pp_tokens=0, min_rounds=2, max_rounds=2
    )
    assert len(rounds) == 2 and all(r["errors"] for r in rounds)


def test_nothing_nan_is_stored_or_exported() -> None:
    good = {"rows": [{"phase": "tg", "depth": 0, "base_ts": 10.0, "tuned_ts": 10.5, "cpu_delta": float("nan")}]}
    require_finite(good, "result")  # an unobserved CPU% is "unknown", not a failed measurement
    bad = {"rows": [*good["rows"], {"phase": "pp", "depth": 4096, "base_ts": float("nan"), "tuned_ts": 3.0}]}
    assert nonfinite(bad) == ["rows[1].base_ts"]
    with pytest.raises(TunerError) as e:
        require_finite(bad, "study 'x''s result")
    assert e.value.exit_code == 1 and "rows[1].base_ts" in str(e.value) and "not exported" in str(e.value)


# ------------------------------------------------------------------ interrupted tune trials


def _tune_env(tmp_path: Path, measure, trials: int = 2):
    """The tune stage on the real CPU space and a real SQLite study, with a fake llama-bench and build."""
    from tests.unit.search.conftest import search_run
    from tuner.plan.space import load_space
    from tuner.search import pipeline as pl
    from tuner.search.tune import tune_stage
    from tuner.targets.archs import load_arch

    cfg = types.SimpleNamespace(
        trials=trials,
        variants=("cpu",),
        arch="cpu",
        target=types.SimpleNamespace(arch=load_arch("cpu")),
        source=types.SimpleNamespace(era="mma", root=tmp_path),
        depths=(0,),
        tune_depths=None,
        tune_knobs=(),
        worker=False,
        gate=False,
        run_dir=tmp_path,
        study="faults",
        seed=0,
        storage=None,
        storage_url=f"sqlite:///{tmp_path / 'study.db'}",
    )
    study, storage = pl._open_study(cfg)
    build = types.SimpleNamespace(build_id="b0", meta={}, bin_dir=tmp_path)
    builds = types.SimpleNamespace(get=lambda variant, cv: build)
    run = search_run(
        cfg, study, storage=storage, space=load_space("cpu", "mma"), builds=builds, factory=lambda b: measure
    )
    return study, lambda: tune_stage(run, [])


def steady(c, phase, depths, label):
    return {
        d: {"ts": 100.0 * (1.05 if c.name == "candidate" else 1.0), "kernel": None, "why": None, "error": ""}
        for d in depths
    }


def _states(study) -> list[tuple[int, str, str | None]]:
    return [(t.number, t.state.name, t.user_attrs.get("status")) for t in study.get_trials(deepcopy=False)]


def test_a_trial_cut_off_by_ctrl_c_is_failed_and_run_again(tmp_path: Path) -> None:
    from tuner.search import tune as tn

    def interrupted(c, phase, depths, label):
        raise KeyboardInterrupt

    study, tune = _tune_env(tmp_path, interrupted)
    with pytest.raises(KeyboardInterrupt):
        tune()
    t0 = study.get_trials(deepcopy=False)[0]
    assert _states(study) == [(0, "FAIL", "interrupted"), (1, "WAITING", None)]  # failed, and queued again
    assert tn.count_done(study) == 0
    study2, tune2 = _tune_env(tmp_path, steady)
    tune2()
    trials = study2.get_trials(deepcopy=False)
    assert tn.count_done(study2) == 2  # the count asked for is reached: the cut-off trial does not count
    assert [s for _, s, _ in _states(study2)].count("COMPLETE") == 2 and trials[1].params == t0.params
    assert trials[1].user_attrs["retry_of"] == 0 and not [t for t in trials if t.state.name in ("RUNNING", "WAITING")]


def test_a_worker_on_another_device_stops_and_leaves_the_trial_for_a_matching_one(tmp_path: Path) -> None:
    """The device check's refusal is not a failed trial: the tune stops, the trial is queued again."""
    from tuner.search.device_guard import OtherDevice, device_checked
    from tuner.study.state import StudyState

    box: dict[str, Any] = {}
    study, tune = _tune_env(tmp_path, lambda *a: box["m"](*a))
    st = StudyState(study)
    st.set_device("GPU A")  # the study's rounds came from GPU A

    def on_gpu_b(c, phase, depths, label):
        return steady(c, phase, depths, label)

    on_gpu_b.info = {"device": "GPU B"}
    box["m"] = device_checked(st, lambda b: on_gpu_b)(None)
    with pytest.raises(OtherDevice, match="GPU A"):
        tune()
    assert _states(study) == [(0, "FAIL", "interrupted"), (1, "WAITING", None)]
    assert st.device == "GPU A"


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigterm_while_the_trial_is_asked_for_still_marks_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """study.ask stores the trial RUNNING before it returns it: a SIGTERM in between left it RUNNING and
    unmarked (a loaded CI box); it is held until the trial is bound, then marks it like any other."""
    from tuner.interrupts import sigterm_interrupts

    study, tune = _tune_env(tmp_path, steady)
    create = study._storage.create_new_trial

    def create_then_sigterm(*a, **kw):
        trial_id = create(*a, **kw)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler runs here, inside study.ask
        return trial_id

    monkeypatch.setattr(study._storage, "create_new_trial", create_then_sigterm)
    with pytest.raises(KeyboardInterrupt), sigterm_interrupts():
        tune()
    assert _states(study) == [(0, "FAIL", "interrupted"), (1, "WAITING", None)]  # failed, and queued again


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed")  # the test's own study.ask()
def test_a_running_trial_of_a_dead_process_is_reaped_at_start(tmp_path: Path) -> None:
    """kill -9 leaves the trial RUNNING: the next search on this host sees its PID is gone."""
    study, tune = _tune_env(tmp_path, steady)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    t = study.ask()
    t.set_user_attr("worker", f"{platform.node()}:{int(dead.stdout)}")
    live = study.ask()  # a live worker's trial (this very test process) is left alone
    live.set_user_attr("worker", f"{platform.node()}:{os.getppid()}")
    tune()
    st = {n: (s, a) for n, s, a in _states(study)}
    assert st[0] == ("FAIL", "interrupted") and st[1] == ("RUNNING", None)
    from tuner.search import tune as tn

    assert tn.count_done(study) == 2


SIGTERM_CHILD = textwrap.dedent("""
    import sys, time, types
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from unit.search.test_search_faults import _tune_env
    from tuner.interrupts import sigterm_interrupts

    marker = Path({marker!r})

    def slow(c, phase, depths, label):
        marker.write_text("measuring")
        time.sleep(120)

    study, tune = _tune_env(Path({run!r}), slow)
    with sigterm_interrupts():
        tune()
""")


def test_sigterm_during_a_trial_then_resume_reaches_the_count(tmp_path: Path) -> None:
    from tuner.search import tune as tn

    marker = tmp_path / "measuring"
    code = SIGTERM_CHILD.format(tests=str(REPO / "tests"), marker=str(marker), run=str(tmp_path))
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert marker.exists(), proc.communicate()[0][-2000:]
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "Terminated: SIGTERM" in out  # a KeyboardInterrupt: unwound like Ctrl-C
    study, tune = _tune_env(tmp_path, steady)
    assert _states(study)[0] == (0, "FAIL", "interrupted")
    tune()
    assert tn.count_done(study) == 2 and [s for _, s, _ in _states(study)].count("COMPLETE") == 2


# ------------------------------------------------------------------ the run-dir lock

HOLD = (
    "import sys, time; from pathlib import Path; from tuner.search.lock import run_dir_lock\n"
    "with run_dir_lock(Path(sys.argv[1]), ['search', '--storage', 'postgresql://u:pw@h/db']):\n"
    "    print('locked', flush=True); time.sleep(60)\n"
)


def test_a_second_search_on_a_locked_run_dir_refuses(tmp_path: Path) -> None:
    from tuner.search.lock import RunDirBusy, read_owner, run_dir_lock

    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        owner = read_owner(tmp_path)
        assert (
            owner["pid"] == holder.pid
            and owner["host"]
            and ":***@h/db" in owner["command"]
            and "pw@" not in owner["command"]
        )
        t0 = time.monotonic()
        with pytest.raises(RunDirBusy) as e, run_dir_lock(tmp_path, ["search"]):
            pass
        assert time.monotonic() - t0 < 1.0  # refused at once, not after waiting
        msg = str(e.value)
        assert (
            e.value.exit_code == 1 and f"PID {holder.pid}" in msg and "--run-dir" in msg and f"kill {holder.pid}" in msg
        )
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()


def test_a_linked_run_dir_or_one_holding_a_link_is_refused_before_anything_is_fetched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `tuner search --run-dir` wrote its study database, locks and logs through links: a run dir that is a link,
    # or a study.db link planted in one, sent them wherever the link pointed.
    from click.testing import CliRunner

    from tuner.cli import cli

    elsewhere, victim = tmp_path / "elsewhere", tmp_path / "victim.db"
    elsewhere.mkdir()
    linked = tmp_path / "run-link"
    linked.symlink_to(elsewhere)
    planted = tmp_path / "run"
    planted.mkdir()
    (planted / "study.db").symlink_to(victim)
    fetched: list[object] = []
    monkeypatch.setattr("tuner.source.fetch_source", lambda spec=None: fetched.append(spec))
    for run_dir, says in (
        (linked, f"--run-dir {linked} is a symbolic link (to {str(elsewhere)!r})"),
        (planted, f"{planted / 'study.db'} is a symbolic link (to {str(victim)!r})"),
    ):
        res = CliRunner().invoke(cli, ["search", "--arch", "cpu", "--run-dir", str(run_dir)], standalone_mode=False)
        err = res.exception
        assert isinstance(err, UsageError) and err.exit_code == 2, res.output
        assert says in str(err) and "--run-dir" in str(err) and "\n" not in str(err), str(err)
    assert fetched == [] and list(elsewhere.iterdir()) == [] and not victim.exists()


def test_the_default_run_dir_is_refused_as_a_link_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.unit.search.test_study_lock import _cfg
    from tuner.search import pipeline

    # the checks before the run dir appears, faked (tests/unit/search/test_study_lock.py does the same)
    monkeypatch.setattr(pipeline, "_checked", lambda cfg: None)
    monkeypatch.setattr(pipeline, "_run_locked", lambda *a: pytest.fail("measured in a linked run dir"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "tuner-runs").mkdir()
    (tmp_path / "tuner-runs" / "s").symlink_to(elsewhere)  # ./tuner-runs/<study>, planted
    with pytest.raises(UsageError, match="is a symbolic link"):
        pipeline.run_pipeline(_cfg(tmp_path / "tuner-runs" / "s", f"sqlite:///{tmp_path / 's.db'}", "s"))
    assert list(elsewhere.iterdir()) == []


def test_a_stale_lock_is_taken_over_with_a_note(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tuner.search.lock import LOCK_NAME, read_owner, run_dir_lock

    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    holder.kill()  # kill -9: no cleanup, the record stays in the file
    holder.wait()
    holder.stdout.close()
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == holder.pid
    with run_dir_lock(tmp_path, ["search"]) as me:
        assert read_owner(tmp_path)["pid"] == me["pid"] == os.getpid()
    err = capsys.readouterr().err
    assert "took over the run dir's lock" in err and f"PID {holder.pid}" in err and "no longer exists" in err
    assert read_owner(tmp_path) == {}  # an orderly end leaves nothing to take over


# ------------------------------------------------------------------ storage URLs


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///",
        "sqlite://",
        "sqlite:///:memory:",
        "sqlite:///file::memory:?cache=shared",
        "sqlite:///x.db?mode=memory",
    ],
)
def test_in_memory_storage_is_refused(url: str) -> None:
    from tuner.study.storage import check_storage_url

    with pytest.raises(UsageError) as e:
        check_storage_url(url)
    assert e.value.exit_code == 2 and "in memory" in str(e.value) and "--storage sqlite:///" in str(e.value)


def test_a_sqlite_folder_that_does_not_exist_is_refused_and_not_created(tmp_path: Path) -> None:
    from tuner.study.storage import check_storage_url, make_storage

    missing = tmp_path / "nonexistent-dir"
    for f in (check_storage_url, make_storage):
        with pytest.raises(UsageError) as e:
            f(f"sqlite:///{missing / 'x.db'}")
        assert f"mkdir -p {missing}" in str(e.value)
    assert not missing.exists()
    assert check_storage_url(f"sqlite:///{tmp_path / 'x.db'}") == f"sqlite:///{tmp_path / 'x.db'}"


@pytest.mark.parametrize(
    "url",
    [
        "postgres",
        "study.db",
        "http://h/db",
        "postgresql://h:port/db",
        "postgresql:///db",
        " sqlite:///x.db",
        "postgresql://u:pw@h:99999/db",
    ],
)
def test_malformed_storage_urls_are_refused_without_the_password(url: str) -> None:
    from tuner.study.storage import check_storage_url

    with pytest.raises(UsageError) as e:
        check_storage_url(url)
    assert e.value.exit_code == 2 and "pw@" not in str(e.value)


def test_a_refused_connection_names_the_url_without_the_password() -> None:
    from tuner.study.storage import make_storage

    pytest.importorskip("psycopg")
    with pytest.raises(UsageError) as e:
        make_storage("postgresql+psycopg://tuner:s3cr3t@127.0.0.1:1/optuna")
    assert "s3cr3t" not in str(e.value) and "tuner:***@127.0.0.1:1/optuna" in str(e.value)
    assert e.value.__cause__ is None  # the driver's exception (which holds the URL) is not chained


def test_a_cpu_search_promises_no_h100_time() -> None:
    from tuner.search.request import SearchRequest, intro
    from tuner.targets.archs import load_arch
    from tuner.targets.target import Target

    cpu, h100 = (Target(arch=load_arch(a), local_archs=()) for a in ("cpu", "sm_90"))
    mine = intro(SearchRequest(target=cpu, model=Path("big.gguf")))
    assert "H100" not in mine and "ETAs after the first round" in mine and "rerunning the same command resumes" in mine
    assert "2-4 minutes on 2 idle cores" in intro(SearchRequest(target=cpu))
    assert "`--dry-run` estimates it stage by stage" in intro(SearchRequest(target=h100))


def test_a_file_system_without_locks_warns_and_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import errno
    import fcntl

    from tuner.search.lock import read_owner, run_dir_lock

    def no_locks(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with run_dir_lock(tmp_path, ["search"]):
        assert read_owner(tmp_path)["pid"] == os.getpid()
    assert "does not support file locks" in capsys.readouterr().err


def test_a_trial_asked_but_never_claimed_is_reaped_after_the_grace_period(tmp_path: Path) -> None:
    """The storage lost between ``ask`` and the trial naming its worker left it RUNNING with no owner and no
    heartbeat: once older than the grace period it is failed and queued again; a fresh one is left alone."""
    import datetime

    import optuna

    from tuner.search import tune as tn
    from tuner.study.storage import GRACE_S

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 's.db'}")
    study = optuna.create_study(study_name="orphan", storage=storage)
    dist = {"x": optuna.distributions.IntDistribution(0, 9)}
    old, fresh = study.ask(dist), study.ask(dist)  # neither names a worker
    assert tn.fail_interrupted(study, storage) == []  # may still be claimed by its asker
    past = datetime.datetime.now() - datetime.timedelta(seconds=GRACE_S + 5)
    frozen = {t.number: t for t in study.get_trials(deepcopy=False)}
    import types

    aged = types.SimpleNamespace(**{**vars(frozen[old.number]), "datetime_start": past})
    assert tn._orphan(aged) and not tn._orphan(frozen[fresh.number])
    with tn.asked_trial(study, storage, dist) as t:  # a trial asked through tuner names its worker at once
        assert t.user_attrs["worker"].endswith(f":{os.getpid()}")
        study.tell(t, 1.0)


def test_a_trial_cut_before_any_value_was_sampled_is_queued_again(tmp_path: Path) -> None:
    """A trial whose process died inside ``ask``, before it sampled a value, is failed and queued again like any
    other: its retry names it and samples every value."""
    import optuna

    from tuner.search import tune as tn
    from tuner.study.state import write_trial

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 's.db'}")
    study = optuna.create_study(study_name="cut", storage=storage)
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    cut = study.ask()  # no distributions: no params
    write_trial(cut, worker=f"{platform.node()}:{dead.pid}")
    assert tn.fail_interrupted(study, storage) == [cut.number]
    dist = {"x": optuna.distributions.IntDistribution(0, 9)}
    retry = study.ask(dist)
    assert retry.user_attrs["retry_of"] == cut.number and "x" in retry.params
    assert [t.state.name for t in study.get_trials(deepcopy=False)] == ["FAIL", "RUNNING"]
