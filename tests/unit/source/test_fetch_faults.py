"""`tuner source fetch` when the disk fills: exit 1 naming the path and "No space left", never
"check the network" or pip's traceback; a network failure keeps its network message."""

from __future__ import annotations

import errno
import sys
import tarfile
from pathlib import Path

import pytest

from tuner._run import RunResult
from tuner.source import fetch as F

MMA = Path(__file__).resolve().parents[2] / "data" / "source" / "tree_mma"

_PIP_ENOSPC = """\
Collecting llama-cpp-python==0.3.36
  Downloading llama_cpp_python-0.3.36.tar.gz (50.1 MB)
ERROR: Exception:
Traceback (most recent call last):
  File "/usr/lib/python3/dist-packages/pip/_internal/cli/base_command.py", line 180, in exc_logging_wrapper
OSError: [Errno 28] No space left on device: '/tmp/pip-unpack-k2j4/llama_cpp_python-0.3.36.tar.gz'
"""
_PIP_NETWORK = """\
WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection broken by \
'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object>: Failed to establish a new connection: \
[Errno 101] Network is unreachable')': /simple/llama-cpp-python/
ERROR: Could not install packages due to an OSError: HTTPSConnectionPool(host='pypi.org', port=443): Max retries exceeded
"""


def _fetch(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """Exit code and the error paragraph (what follows 'tuner: error: '; progress lines come before)."""
    from tuner.cli import main

    monkeypatch.setattr(sys, "argv", ["tuner", "source", "fetch", *args])
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err.partition("tuner: error: ")[2]


def _pip_says(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    def fake_run(cmd: list[str], **kw: object) -> RunResult:
        log_file = kw["log_file"]
        assert isinstance(log_file, Path)
        log_file.write_text(text)
        return RunResult(returncode=2, output="", seconds=0.1, log_file=log_file)

    monkeypatch.setattr(F, "run", fake_run)


def test_pip_out_of_space_names_the_path(
    isolated_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _pip_says(monkeypatch, _PIP_ENOSPC)
    code, err = _fetch(monkeypatch, capsys)
    assert code == 1
    assert "No space left on device while writing /tmp/pip-unpack-k2j4/llama_cpp_python-0.3.36.tar.gz" in err
    assert "network" not in err and err.count("\n") == 1
    assert list((isolated_home / "sources").iterdir()) == []  # the staging folder is gone


def test_network_failure_keeps_its_message(
    isolated_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _pip_says(monkeypatch, _PIP_NETWORK)
    code, err = _fetch(monkeypatch, capsys)
    assert code == 1 and "check the network" in err and "Network is unreachable" in err
    assert "No space left" not in err


@pytest.mark.parametrize("where", ["extract", "log", "index"])
def test_enospc_while_fetching_is_exit_1_naming_the_path(
    where: str, isolated_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """ENOSPC raised in tuner itself: extracting the sdist, writing pip's log, writing the SPEC index."""
    full = OSError(errno.ENOSPC, "No space left on device", "/full/disk/file")

    def download(version: str, dest: Path) -> Path:
        if where == "log":
            raise full  # what _run.run raises when the log file cannot be written
        dest.mkdir(parents=True)
        sdist = dest / "llama_cpp_python-0.3.36.tar.gz"
        with tarfile.open(sdist, "w:gz") as tar:
            tar.add(MMA, arcname="llama_cpp_python-0.3.36/vendor/llama.cpp")
        return sdist

    def boom(*a: object, **kw: object) -> None:
        raise full

    monkeypatch.setattr(F, "run_pip_download", download)
    if where == "extract":
        monkeypatch.setattr(F, "_extract_vendor_tree", boom)
    if where == "index":
        real = F.write_json
        monkeypatch.setattr(F, "write_json", lambda p, d: boom() if "specs" in p.parts else real(p, d))
    code, err = _fetch(monkeypatch, capsys)
    assert code == 1, err
    assert err.startswith("No space left on device while writing /full/disk/file.")
    assert "network" not in err and err.count("\n") == 1


def test_git_clone_out_of_space(
    isolated_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(
        F,
        "run",
        lambda cmd, **kw: RunResult(
            returncode=128, output="fatal: write error: No space left on device\nfatal: index-pack failed", seconds=1
        ),
    )
    code, err = _fetch(monkeypatch, capsys, "git:https://github.com/ggml-org/llama.cpp@b6129")
    assert code == 1 and "No space left on device while writing " in err and "network" not in err
