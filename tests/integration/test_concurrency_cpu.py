"""Commands that run at once: `tuner build` of the variant a real CPU search runs, a second search on
its study, and the PostgreSQL study lock.

The search runs the real CLI in a child process on the session's cached CPU build (tests/conftest.py
``cpu_build``) and the ``tiny`` model; `tuner build` adds llama-tokenize to that variant meanwhile.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SMALL = ["--variant", "cpu", "--depths", "0,256", "--pp", "32", "--tg", "8", "--min-rounds", "3", "--max-rounds", "3"]
ADDED = "llama-tokenize"


def _without_added(art: Path) -> Path:
    """Make the artifact's current folder one without ADDED (a copy, installed as tuner installs builds),
    so the `tuner build --targets ADDED` below has something to add on every run of this test."""
    from tuner.builder import records

    cur = records.current_artifact(art)
    assert cur is not None
    if not (cur / "bin" / ADDED).exists():
        return cur
    staging = art.with_name(f"{art.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(cur, staging, symlinks=True, ignore=shutil.ignore_patterns(ADDED, ".users"))
    rec = json.loads((staging / "build.json").read_text())
    rec["targets"] = [t for t in rec.get("targets", []) if t != ADDED]
    rec.get("extra_targets", {}).pop(ADDED, None)
    (staging / "build.json").write_text(json.dumps(rec))
    root = art.parents[1]
    with records.locked(root):
        return records.install_artifact(staging, art)


def test_a_build_adding_a_target_leaves_the_running_search_its_binaries(
    cpu_build, tiny_model, tuner_home: Path, tmp_path: Path, tuner, load
) -> None:
    art = Path(cpu_build.bin_dir).parent.parent / cpu_build.meta["artifact_key"]
    before = _without_added(art)
    env = {**os.environ, "TUNER_HOME": str(tuner_home), "PYTHONUNBUFFERED": "1"}
    run = tmp_path / "run"
    storage = f"sqlite:///{run / 'study.db'}"
    args = ["search", *SMALL, "--model", str(tiny_model), "--run-dir", str(run), "--study", "c", "--trials", "2"]
    search = subprocess.Popen(
        [sys.executable, "-m", "tuner", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 600
        while not list((run / "logs").glob("screen-*.log")):  # the search has started measuring
            assert search.poll() is None, search.communicate()[1][-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.5)
        # a second search on its study from another run dir is refused at once, naming the first
        other = tuner(*args[:-6], "--run-dir", str(tmp_path / "other"), "--study", "c", "--storage", storage,
                      "--trials", "2", home=tuner_home, check=False)  # fmt: skip
        assert other.returncode == 1 and f"PID {search.pid}" in other.stderr, other.stderr[-3000:]
        assert "tuner worker" in other.stderr
        build = tuner("build", "--arch", "cpu", "--variant", "cpu", "--targets", ADDED, home=tuner_home, timeout=1800)
        running = search.poll() is None
        after = tuner(
            "build", "--arch", "cpu", "--variant", "cpu", "--targets", f"llama-bench,{ADDED}", home=tuner_home
        )
        out, err = search.communicate(timeout=1800)
    finally:
        if search.poll() is None:
            search.kill()
            search.communicate()
    assert search.returncode == 0, err[-3000:]
    assert running, "the search ended before the build did: nothing ran at once (make the search longer)"
    # the build installed a new folder with the variant's tools and the added one; the search's stayed
    now = Path(os.path.realpath(art))
    assert now != before and (now / "bin" / ADDED).is_file() and (now / "bin" / "llama-bench").is_file()
    assert "| cached" in after.stdout and "yes" in after.stdout.split("| cached", 1)[1].splitlines()[0]
    assert "no" in build.stdout.split("| cached", 1)[1].splitlines()[0]
    st = load(storage, "c")
    stored = json.dumps(st.user_attrs, default=str) + json.dumps([t.user_attrs for t in st.trials], default=str)
    assert "not found" not in stored and "No such file" not in stored and "not found" not in err
    assert len(st.trials) == 2 and all(t.user_attrs.get("status") != "failed" for t in st.trials)
    assert all(r.get("phase") for r in st.user_attrs["screen_rounds"]) and "Result:" in out


def test_a_second_search_on_a_postgres_study_is_refused(postgres: str, tmp_path: Path) -> None:
    from tuner.search.lock import StudyBusy

    code = (
        "import sys, time; from tuner.search.lock import study_lock\n"
        "with study_lock(sys.argv[1], 'shared'):\n"
        "    print('locked', flush=True); time.sleep(120)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, postgres], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None
    try:
        assert holder.stdout.readline().strip() == "locked"
        from tuner.search.lock import study_lock

        with pytest.raises(StudyBusy) as e, study_lock(postgres, "shared"):
            pass
        assert f"PID {holder.pid} on host" in str(e.value) and "tuner worker" in str(e.value)
        with study_lock(postgres, "another"):  # another study in the same database
            pass
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    deadline = time.monotonic() + 30
    while True:  # the server ends the killed holder's session, and with it the lock
        try:
            with study_lock(postgres, "shared"):
                break
        except StudyBusy:
            assert time.monotonic() < deadline
            time.sleep(0.5)
