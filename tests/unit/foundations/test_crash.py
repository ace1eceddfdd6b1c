"""An unexpected exception in any command ends in one paragraph and a log file, never a traceback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import tuner.log
from tuner import crash, extras
from tuner.cli import cli, main
from tuner.errors import UsageError
from tuner.paths import tuner_home


def _boom(*args: object, **kwargs: object) -> None:
    raise RuntimeError("injected failure for the test\nsecond line that must not be printed")


def _main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["tuner", *argv])
    with pytest.raises(SystemExit) as exc:
        main()
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


@pytest.fixture()
def crashing(monkeypatch: pytest.MonkeyPatch, isolated_home: Path) -> Path:
    monkeypatch.delenv("TUNER_DEBUG", raising=False)
    monkeypatch.setenv("TUNER_TEST_MARKER", "kept-in-log")
    monkeypatch.setattr(tuner.log, "table", _boom)  # `tuner archs` prints its table with it
    return isolated_home


def test_unexpected_exception_is_one_paragraph_and_a_log(
    crashing: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _out, err = _main(monkeypatch, capsys, "archs")
    assert code == crash.EXIT_INTERNAL == 70
    assert "Traceback" not in err and 'File "' not in err
    assert len(err.strip().splitlines()) == 1, err  # one paragraph
    assert err.startswith("tuner: internal error while running `tuner archs`: RuntimeError: injected failure")
    assert "second line" not in err
    assert "TUNER_DEBUG=1" in err and "tuner --debug archs" in err
    m = re.search(r"are in (\S+\.log)", err)
    assert m, err
    log_file = Path(m.group(1))
    assert log_file.parent == crashing / "logs"
    text = log_file.read_text()
    assert "Traceback (most recent call last)" in text
    assert "RuntimeError: injected failure for the test" in text and "_boom" in text
    assert "argv:      ['archs']" in text
    assert "TUNER_TEST_MARKER=kept-in-log" in text
    assert re.search(r"^python:\s+3\.", text, re.M) and re.search(r"^platform:", text, re.M)


@pytest.mark.parametrize("how", ["flag", "env"])
def test_debug_shows_the_traceback(
    crashing: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    if how == "env":
        monkeypatch.setenv("TUNER_DEBUG", "1")
        argv: tuple[str, ...] = ("archs",)
    else:
        argv = ("--debug", "archs")
    code, _, err = _main(monkeypatch, capsys, *argv)
    assert code == 70
    assert "Traceback (most recent call last)" in err and "_boom" in err
    assert "tuner: internal error while running" in err
    assert "The traceback is above" in err


def test_crash_log_falls_back_to_temp_when_tuner_home_is_bad(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("TUNER_HOME", str(blocker))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.delenv("TUNER_DEBUG", raising=False)
    monkeypatch.setattr(tuner.log, "table", _boom)
    code, _, err = _main(monkeypatch, capsys, "archs")
    assert code == 70
    assert str(tmp_path / "tmp" / "tuner-logs" / "crash-") in err


def test_help_documents_exit_codes() -> None:
    res = CliRunner().invoke(cli, ["--help"])
    assert res.exit_code == 0
    for code in ("0", "1", "2", "70", "130"):
        assert re.search(rf"^\s+{code}\s+\S", res.output, re.M), res.output
    assert "--debug" in res.output and "TUNER_DEBUG" in res.output


@pytest.mark.parametrize("kind", ["file", "under-a-file"])
def test_bad_tuner_home_is_a_usage_error(tmp_path: Path, kind: str) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    home = blocker if kind == "file" else blocker / "sub"
    env = {**os.environ, "TUNER_HOME": str(home)}
    env.pop("TUNER_DEBUG", None)
    # A real process through the console-script entry point: what a user sees.
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            "from tuner.cli import main; main()",
            "model",
            "synth",
            "--like",
            "tiny",
            "-o",
            str(tmp_path / "m.gguf"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    assert res.stderr.startswith(f"tuner: error: TUNER_HOME={home} is not usable: ")
    assert "Point TUNER_HOME at a writable folder" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_tuner_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    monkeypatch.setenv("TUNER_HOME", str(ro))
    try:
        with pytest.raises(UsageError, match="not writable"):
            tuner_home()
    finally:
        ro.chmod(0o700)


def test_missing_optional_module_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], isolated_home: Path
) -> None:
    def no_pyarrow(*args: object, **kwargs: object) -> None:
        raise ModuleNotFoundError("No module named 'pyarrow'", name="pyarrow")

    monkeypatch.setattr(tuner.log, "table", no_pyarrow)
    code, _, err = _main(monkeypatch, capsys, "archs")
    assert code == 2
    assert "Traceback" not in err
    assert "'parquet' extra" in err and "[parquet]'" in err and "pip install -e" in err


@pytest.mark.parametrize(("module", "extra"), [("psycopg", "postgres"), ("psycopg2", "postgres"), ("pynvml", "nvml")])
def test_extras_map(module: str, extra: str) -> None:
    err = extras.missing_module_error(ModuleNotFoundError(f"No module named {module!r}", name=module))
    assert err is not None and f"[{extra}]'" in str(err)
    assert extras.missing_module_error(ModuleNotFoundError("x", name="numpy")) is None


def test_debug_requested(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TUNER_DEBUG", raising=False)
    assert crash.debug_requested(["--debug", "search"])
    assert crash.debug_requested(["-v", "--debug", "search"])
    assert not crash.debug_requested(["search", "--debug"])  # a subcommand option, not ours
    assert not crash.debug_requested(["search"])
