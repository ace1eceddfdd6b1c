"""What every measuring stage checks before it runs a llama.cpp tool (the executable is in the build's bin
directory, the environment overrides are well-formed), and how it runs one (bench, gate, soak, residency,
equivalence). Which device a build's backend measures on is asked of the build itself (:func:`backend_device`): a
sweep's stores record it, so samples from two GPU models (an H100 and an H200 lent for one session, say) never mix
in one file."""

from __future__ import annotations

import contextlib
import os
import platform
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tuner import _run
from tuner.errors import TunerError, UsageError

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DEV_RE = re.compile(r"^\s*(?P<name>[A-Za-z][\w-]*): (?P<desc>.+?)(?: \(\d+ MiB, \d+ MiB free\))?\s*$")


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


def check_model(model: Path) -> Path:
    """``model`` as a Path when it is a file, else a UsageError saying how to make one."""
    model = Path(model)
    if not model.is_file():
        raise UsageError(
            f"Model {model} does not exist. Pass a GGUF file "
            "(`tuner model synth --like tiny -o FILE` makes a small random-weight one)."
        )
    return model


def find_bin_dir(path: Path, exe: str = "llama-bench") -> Path:
    """The directory holding ``exe``: PATH itself, PATH/bin or PATH/build/bin (what --build may point at)."""
    for cand in (path, path / "bin", path / "build" / "bin"):
        if (cand / exe).is_file():
            return cand
    raise UsageError(
        f"No {exe} under {path} (looked in ., bin/ and build/bin/). Pass --build with a build "
        "directory or its bin directory (`tuner build` prints it)."
    )


def run_tool(
    cmd: Sequence[str | os.PathLike[str]],
    env: Mapping[str, str],
    *,
    log_file: Path,
    timeout: float,
    what: str,
    on_line: Callable[[str], None] | None = None,
    base: Mapping[str, str] | None = None,
) -> tuple[int, str]:
    """Run a measuring tool with ``env`` (checked: :func:`check_env`) over ``base`` (default ours): ``(exit code,
    "")``, or ``(-1, why)`` when ``env`` is bad, the tool timed out or would not start: a failed run is data."""
    try:
        full_env = {**(os.environ if base is None else base), **check_env(env)}
        res = _run.run(cmd, env=full_env, log_file=log_file, timeout=timeout, check=False, on_line=on_line, what=what)
    except TunerError as err:
        return -1, str(err)
    return res.returncode, ""


def bench_exit_error(rc: int, lines: Sequence[str], log_file: Path) -> str:
    """Why a one-process llama-bench probe (soak, residency) exited ``rc``: its first line naming an error,
    else its log's last two lines."""
    first = next((ln.strip() for ln in lines if "error" in ln.lower()), "") or _run.tail(log_file, 2)
    return f"llama-bench exited with code {rc}: {first[:300]} (log {log_file})"


def parse_list_devices(text: str) -> dict[str, str]:
    """``llama-bench --list-devices`` output -> {backend device name: description}, e.g.
    ``{"CUDA0": "NVIDIA H100 80GB HBM3"}`` (the memory figures dropped: free memory changes between calls)."""
    # not the "Available devices:" header or "(none)": neither is "NAME: ..."
    return {m["name"]: m["desc"] for line in text.splitlines() if (m := _DEV_RE.match(line))}


def backend_device(bin_dir: Path, backend: str) -> str | None:
    """The device ``backend`` (``CUDA0``, ``CPU``) of the build in ``bin_dir`` runs on, in words; None where the
    build cannot say (no llama-bench in it, or the backend is not listed)."""
    if backend.upper().startswith("CPU"):  # the CPU's model name
        with contextlib.suppress(OSError):
            for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
                if line.startswith("model name"):
                    return f"CPU {line.split(':', 1)[1].strip()}"
        return f"CPU {platform.processor() or platform.machine()}"
    exe = Path(bin_dir) / "llama-bench"
    if not (exe.is_file() and os.access(exe, os.X_OK)):
        return None
    try:
        res = _run.run([exe, "--list-devices"], timeout=120, check=False, what="llama-bench --list-devices")
    except TunerError:
        return None
    return parse_list_devices(res.output).get(backend)
