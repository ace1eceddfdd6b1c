"""The machine's faults (a full disk, a folder not writable, a file in the way, a missing path) are exit 1
with one paragraph naming the path and the fix, through the CLI; exit 70 stays for real bugs."""

from __future__ import annotations

import errno
import lzma
import os
import sys
from pathlib import Path

import pytest

from tuner.cli import main, os_error_message

ROOT = Path(__file__).resolve().parents[3]
DB = ROOT / "results" / "sm_89" / "llama-3.2-1b-q4_k_m-measured-on-h100" / "evidence" / "study.db.xz"


def _tuner(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["tuner", *args])
    monkeypatch.delenv("TUNER_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exc:
        main()
    return int(exc.value.code or 0), capsys.readouterr().err


def _export_args(tmp_path: Path, out: Path) -> list[str]:
    db = tmp_path / "study.db"
    db.write_bytes(lzma.decompress(DB.read_bytes()))
    return ["export", "--study", "sm89-l1b-v4", "--storage", f"sqlite:///{db}", "-o", str(out)]


def _one_paragraph(err: str) -> None:
    assert err.startswith("tuner: error: ") and "Traceback" not in err and "bug in tuner" not in err
    assert len(err.strip().splitlines()) == 1


def test_file_in_the_way_of_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "results"
    blocker.write_text("not a folder\n")
    code, err = _tuner(monkeypatch, capsys, *_export_args(tmp_path, blocker / "sm_89" / "l1b"))
    assert code == 1, err
    _one_paragraph(err)
    assert f"a file is in the way at {blocker}" in err and "Remove or rename" in err


def test_unwritable_export_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    parent = tmp_path / "ro"
    parent.mkdir()
    args = _export_args(tmp_path, parent / "out")
    if os.geteuid() == 0:  # root writes through any mode bits: the OS's own PermissionError, injected
        import tempfile

        def denied(*a: object, dir: str | None = None, **k: object) -> str:
            raise PermissionError(errno.EACCES, "Permission denied", str(Path(str(dir)) / "x"))

        monkeypatch.setattr(tempfile, "mkdtemp", denied)
    else:
        parent.chmod(0o500)
    try:
        code, err = _tuner(monkeypatch, capsys, *args)
    finally:
        parent.chmod(0o700)
    assert code == 1, err
    _one_paragraph(err)
    assert f"permission denied on {parent}" in err and f"Make {parent} writable" in err and "another -o" in err


def test_full_disk_during_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    real = Path.write_text

    def full(self: Path, *a: object, **k: object) -> int:
        if self.name == "config.toml":
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, *a, **k)  # type: ignore[arg-type]

    args = _export_args(tmp_path, out)
    monkeypatch.setattr(Path, "write_text", full)
    code, err = _tuner(monkeypatch, capsys, *args)
    assert code == 1, err
    _one_paragraph(err)
    assert "no space left on the device while writing" in err and "Free space on the disk holding" in err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["study.db"]


def test_full_disk_without_a_path_is_not_a_bug(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], isolated_home: Path
) -> None:
    # e.g. a search's SQLite or a log flush failing: the OS gives no file name, only ENOSPC
    import tuner.result.validate as validate

    def full(*a: object, **k: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(validate, "validate_paths", full)
    code, err = _tuner(monkeypatch, capsys, "validate", str(tmp_path))
    assert code == 1, err
    _one_paragraph(err)
    assert "Free space on the disk tuner was writing to" in err


def test_full_study_database_is_not_a_bug(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], isolated_home: Path
) -> None:
    # A search's SQLite write on a full disk: sqlite3 reports SQLITE_FULL, SQLAlchemy and Optuna wrap it.
    import sqlite3

    import tuner.result.validate as validate

    def full(*a: object, **k: object) -> None:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as err:
            raise RuntimeError("(sqlite3.OperationalError) database or disk is full [SQL: UPDATE trials ...]") from err

    monkeypatch.setattr(validate, "validate_paths", full)
    code, err = _tuner(monkeypatch, capsys, "validate", str(tmp_path))
    assert code == 1, err
    _one_paragraph(err)
    assert "no space left on the device" in err and "the study database reported: (sqlite3.OperationalError)" in err


def test_os_error_without_a_path_stays_a_bug(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], isolated_home: Path
) -> None:
    import tuner.result.validate as validate

    def broken(*a: object, **k: object) -> None:
        raise OSError(errno.EBADF, "Bad file descriptor")

    monkeypatch.setattr(validate, "validate_paths", broken)
    code, err = _tuner(monkeypatch, capsys, "validate", str(tmp_path))
    assert code == 70, err
    assert "bug in tuner" in err


@pytest.mark.parametrize(
    ("err", "want"),
    [
        (OSError(errno.EROFS, "Read-only file system", "/mnt/ro/out"), "/mnt/ro/out is on a read-only file system"),
        (
            OSError(errno.EDQUOT, "Disk quota exceeded", "/q/out/report.md"),
            "the disk quota is exhausted while writing (/q/out/report.md)",
        ),
        (
            FileNotFoundError(errno.ENOENT, "No such file or directory", "/no/such/model.gguf"),
            "/no/such/model.gguf does not exist",
        ),
        (IsADirectoryError(errno.EISDIR, "Is a directory", "/tmp"), "a folder is in the way at"),
    ],
)
def test_messages_name_the_path_and_the_fix(err: OSError, want: str) -> None:
    msg = os_error_message(err)
    assert msg is not None and want in msg
