"""A build's toolchain identity follows the tools' content, not where a venv put them."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tuner.builder.cmake import _fingerprint


def test_same_tool_in_two_venvs_has_one_identity(tmp_path: Path) -> None:
    a, b = tmp_path / "venvA" / "bin" / "cmake", tmp_path / "venvB" / "bin" / "cmake"
    for p in (a, b):
        p.parent.mkdir(parents=True)
    a.write_bytes(b"\x7fELF cmake 4.4.4" * 1000)
    shutil.copyfile(a, b)
    os.utime(b, ns=(1, 1))  # installed at another time
    assert _fingerprint(a) == _fingerprint(b)


def test_a_different_tool_changes_the_identity(tmp_path: Path) -> None:
    a, b = tmp_path / "a" / "cmake", tmp_path / "b" / "cmake"
    for p, body in ((a, b"cmake 4.4.4"), (b, b"cmake 4.4.5")):
        p.parent.mkdir()
        p.write_bytes(body)
    assert _fingerprint(a) != _fingerprint(b)
    assert _fingerprint(None) == [None]
