"""What every measuring stage checks before it runs a llama.cpp tool: the executable is in the build's
bin directory, and the environment overrides are well-formed (bench, gate, soak, residency, equivalence)."""

from __future__ import annotations

__all__ = ["check_env", "find_bin_dir", "find_exe"]

import os
import re
from collections.abc import Mapping
from pathlib import Path

from tuner.errors import UsageError

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` as a dict when every name is a shell variable name and every value a string without NUL."""
    out = {}
    for k, v in env.items():
        if not isinstance(k, str) or not _ENV_NAME.match(k):
            raise UsageError(f"Environment variable name {k!r} is invalid; use letters, digits and _.")
        if not isinstance(v, str) or "\0" in v:
            raise UsageError(f"Environment value for {k} must be a string without NUL (got {v!r}).")
        out[k] = v
    return out


def find_exe(bin_dir: Path, name: str) -> Path:
    """``bin_dir/name`` when it is an executable file, else a UsageError saying how to get it."""
    exe = Path(bin_dir) / name
    if not exe.is_file() or not os.access(exe, os.X_OK):
        raise UsageError(
            f"{name} not found in {bin_dir}. Point --build at a build's bin directory (it must "
            f"contain {name}; `tuner build` builds it), or build llama.cpp with that target."
        )
    return exe


def find_bin_dir(path: Path, exe: str = "llama-bench") -> Path:
    """The directory holding ``exe``: PATH itself, PATH/bin or PATH/build/bin (what --build may point at)."""
    for cand in (path, path / "bin", path / "build" / "bin"):
        if (cand / exe).is_file():
            return cand
    raise UsageError(
        f"No {exe} under {path} (looked in ., bin/ and build/bin/). Pass --build with a build "
        "directory or its bin directory (`tuner build` prints it)."
    )
