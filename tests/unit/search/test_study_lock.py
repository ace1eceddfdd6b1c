"""One ``tuner search`` per study, not only per run dir: the study lock beside a SQLite database.

The PostgreSQL advisory lock needs a server: tests/integration/test_concurrency_cpu.py takes it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from tuner.rounds.budget import Budget
from tuner.search import pipeline
from tuner.search.lock import StudyBusy, study_lock, study_lock_path

REPO = Path(__file__).resolve().parents[3]


def _cfg(run_dir: Path, storage: str, study: str) -> Any:
    return types.SimpleNamespace(
        budget=Budget(),
        source=types.SimpleNamespace(era="mma"),
        arch="cpu",
        variants=None,
        fixed={},
        model=Path("m.gguf"),
        depths=[0],
        run_dir=run_dir,
        storage_url=storage,
        study=study,
    )


def test_a_second_search_on_the_study_from_another_run_dir_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the checks before the lock, faked: this test is about what runs under it
    monkeypatch.setattr(pipeline, "_checked", lambda cfg: None)
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    measured: list[Path] = []
    refused: list[StudyBusy] = []

    def run_locked(cfg: Any, *args: Any) -> str:
        measured.append(cfg.run_dir)
        if len(measured) == 1:  # while the first search measures, a second starts on its study elsewhere
            try:
                pipeline.run_pipeline(_cfg(tmp_path / "b", storage, "s"))
            except StudyBusy as err:
                refused.append(err)
        return "outcome"

    monkeypatch.setattr(pipeline, "_run_locked", run_locked)
    assert pipeline.run_pipeline(_cfg(tmp_path / "a", storage, "s")) == "outcome"
    assert measured == [tmp_path / "a"]  # the second never measured a round
    msg = str(refused[0])
    assert refused[0].exit_code == 1 and f"PID {os.getpid()}" in msg and "`tuner " in msg
    assert "'s'" in msg and "tuner worker" in msg and "--study" in msg
    # once the first is done, the study is free again
    assert pipeline.run_pipeline(_cfg(tmp_path / "b", storage, "s")) == "outcome"


def test_the_lock_is_the_study_in_its_database(tmp_path: Path) -> None:
    db = tmp_path / "data" / "study.db"
    db.parent.mkdir()
    (tmp_path / "link").symlink_to(db.parent)
    url = f"sqlite:///{db}"
    with study_lock(url, "s", ["search", "--study", "s"]):
        with pytest.raises(StudyBusy), study_lock(f"sqlite:///{tmp_path / 'link' / 'study.db'}", "s"):
            pass  # the same database through another path
        with study_lock(url, "other"):  # another study in the same database
            pass
        with study_lock(f"sqlite:///{tmp_path / 'else.db'}", "s"):  # the same name in another database
            pass
    assert study_lock_path(url, "s").parent == db.parent


def test_a_killed_search_leaves_no_lock_on_its_study(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    code = (
        "import sys, time; from tuner.search.lock import study_lock\n"
        "with study_lock(sys.argv[1], 's', ['search', '--run-dir', 'elsewhere']):\n"
        "    print('locked', flush=True); time.sleep(60)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, url], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(StudyBusy) as e, study_lock(url, "s"):
            pass
        assert f"PID {holder.pid}" in str(e.value) and "`tuner search --run-dir elsewhere`" in str(e.value)
    finally:
        holder.kill()  # kill -9: the kernel drops its lock
        holder.wait()
        holder.stdout.close()
    with study_lock(url, "s"):
        pass
    assert f"PID {holder.pid}" in capsys.readouterr().err  # taken over, with a note naming the dead one
