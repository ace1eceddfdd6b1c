"""A build used by a running command is never replaced under it, and a command waiting on a build lock says so.

No compiler runs (tuner._run.run is faked as in test_build.py); the holders of a build are child
processes, since a process's own hold on its build lasts as long as the process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tests.unit.builder.test_build import FakeRun, fake_tools, make_rv  # noqa: F401 (fixtures)
from tests.unit.builder.test_carry import packed  # noqa: F401
from tuner import _run
from tuner.builder import cmake as B
from tuner.builder import records

REPO = Path(__file__).resolve().parents[3]


def _child(code: str, home: Path) -> subprocess.Popen[str]:
    """A Python child that runs ``code``, prints "ready" once it holds what it takes, and sleeps until killed."""
    env = {**os.environ, "TUNER_HOME": str(home), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait(timeout=30)
    if proc.stdout is not None:
        proc.stdout.close()


def test_adding_a_target_installs_a_new_folder_and_keeps_the_one_in_use(
    fake_tools: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_run, "run", FakeRun())
    rv = make_rv()
    used = B.build_variant(rv, targets=["llama-bench"])  # what a running search holds
    exe = used.bin_dir / "llama-bench"
    added = B.build_variant(rv, targets=["llama-perplexity"])  # `tuner build --targets llama-perplexity`
    assert exe.is_file() and json.loads((used.bin_dir.parent / "build.json").read_text())["targets"] == ["llama-bench"]
    assert added.bin_dir != used.bin_dir
    # the new folder holds what the variant had and what was added, so neither command rebuilds the other's
    assert {p.name for p in added.bin_dir.iterdir()} >= {"llama-bench", "llama-perplexity"}
    stable = fake_tools / "builds" / rv.key / "artifacts" / rv.artifact_key / "bin"
    assert stable.resolve() == added.bin_dir.resolve()
    assert B.build_variant(rv, targets=["llama-bench", "llama-perplexity"]).cached


def test_an_old_folder_goes_when_no_one_runs_from_it(fake_tools: Path) -> None:  # noqa: F811
    art = fake_tools / "builds" / "k" / "artifacts" / "a"

    def install(tag: str) -> Path:
        staging = art.with_name(f"a.partial-{tag}")
        (staging / "bin").mkdir(parents=True)
        (staging / "bin" / "llama-bench").write_text(tag)
        return records.install_artifact(staging, art)

    first = install("1")
    holder = _child(
        f"""
        from pathlib import Path
        from tuner.builder import records
        got = records.hold_artifact(Path({str(art)!r}), lambda d: (d / "bin" / "llama-bench").read_text())
        assert got is not None and got[1] == "1", got
        print("ready", flush=True)
        import time; time.sleep(600)
        """,
        fake_tools,
    )
    try:
        second = install("2")
        assert (first / "bin" / "llama-bench").read_text() == "1"  # the child still runs from it
        assert (art / "bin" / "llama-bench").read_text() == "2" and second != first
    finally:
        _stop(holder)
    third = install("3")
    assert not first.exists() and not second.exists()  # no one held them any more
    assert records.current_artifact(art) == third


def test_a_folder_from_before_versions_is_moved_and_used(fake_tools: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """An artifact folder written by an older tuner (a real folder, not a link) is still a cache hit."""
    monkeypatch.setattr(_run, "run", FakeRun())
    rv = make_rv()
    b = B.build_variant(rv, targets=["llama-bench"])
    art = fake_tools / "builds" / rv.key / "artifacts" / rv.artifact_key
    real = art.resolve()
    os.unlink(art)
    os.rename(real, art)  # the old layout
    (art / ".users").unlink()
    monkeypatch.setattr(_run, "run", lambda *a, **k: pytest.fail("a cached build started a process"))
    again = B.build_variant(rv, targets=["llama-bench"])
    assert again.cached and art.is_symlink() and (again.bin_dir / "llama-bench").is_file()
    assert again.build_id == b.build_id


def test_a_command_waiting_on_a_build_lock_names_the_holder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "builds" / "k"
    holder = _child(
        f"""
        import sys
        from pathlib import Path
        from tuner.builder import records
        sys.argv = ["tuner", "build", "--arch", "cpu", "--targets", "llama-perplexity"]
        with records.locked(Path({str(root)!r})):
            print("ready", flush=True)
            import time; time.sleep(600)
        """,
        tmp_path,
    )
    monkeypatch.setattr(records, "WAIT_NOTE_S", 0.3)
    threading.Timer(1.2, _stop, args=(holder,)).start()
    t0 = time.monotonic()
    with records.locked(root):
        waited = time.monotonic() - t0
    err = capsys.readouterr().err
    assert waited >= 1.0
    first = err.splitlines()[0]
    assert f"PID {holder.pid}" in first and "`tuner build --arch cpu --targets llama-perplexity`" in first
    assert "still waiting" in err and " s so far" in err.split("still waiting", 1)[1]


def test_a_pack_installed_over_a_build_in_use_keeps_that_build(packed: Path) -> None:  # noqa: F811
    from tests.unit.builder.test_carry import make_rv as carry_rv
    from tuner.builder import carry

    first = carry.unpack_build(packed, carry_rv())
    second = carry.unpack_build(packed, carry_rv())  # `tuner build --from-pack` again while the first runs
    assert (first.bin_dir / "llama-bench").is_file() and (second.bin_dir / "llama-bench").is_file()
    assert second.bin_dir != first.bin_dir and second.cached


def test_an_extra_target_goes_into_the_current_folder_where_a_later_build_moved_it(
    fake_tools: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A session's Build names the folder of its first build; another command then added a target (a new
    folder). An extra tool added through the older Build must land in the current folder, or the next cached
    lookup (which reads the current one) finds it missing: the last CI run's cold cache hit exactly this."""
    from tuner.builder.cmake import ensure_targets

    monkeypatch.setattr(_run, "run", FakeRun())
    rv = make_rv()
    first = B.build_variant(rv, targets=["llama-bench"])
    later = B.build_variant(rv, targets=["llama-tokenize"])  # e.g. `tuner build --targets llama-tokenize`
    assert later.bin_dir != first.bin_dir
    got = ensure_targets(first, ["llama-perplexity"])
    assert got.bin_dir == later.bin_dir and (later.bin_dir / "llama-perplexity").is_file()
    monkeypatch.setattr(_run, "run", lambda *a, **k: pytest.fail("rebuilt"))
    again = B.build_variant(rv, targets=["llama-bench"])
    assert again.cached and again.build_id == first.build_id and (again.bin_dir / "llama-perplexity").is_file()
