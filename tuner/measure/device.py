"""Which device a build's backend measures on, asked of the build itself: a sweep's stores record it, so
samples from two GPU models (an H100 and an H200 lent for one session, say) never mix in one file."""

from __future__ import annotations

import contextlib
import os
import platform
import re
from pathlib import Path

from tuner import _run
from tuner.errors import TunerError

_DEV_RE = re.compile(r"^\s*(?P<name>[A-Za-z][\w-]*): (?P<desc>.+?)(?: \(\d+ MiB, \d+ MiB free\))?\s*$")


def parse_list_devices(text: str) -> dict[str, str]:
    """``llama-bench --list-devices`` output -> {backend device name: description}, e.g.
    ``{"CUDA0": "NVIDIA H100 80GB HBM3"}`` (the memory figures dropped: free memory changes between calls)."""
    # not the "Available devices:" header or "(none)": neither is "NAME: ..."
    return {m["name"]: m["desc"] for line in text.splitlines() if (m := _DEV_RE.match(line))}


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def backend_device(bin_dir: Path, backend: str) -> str | None:
    """The device ``backend`` (``CUDA0``, ``CPU``) of the build in ``bin_dir`` runs on, in words; None where the
    build cannot say (no llama-bench in it, or the backend is not listed)."""
    if backend.upper().startswith("CPU"):
        return f"CPU {_cpu_model()}"
    exe = Path(bin_dir) / "llama-bench"
    if not (exe.is_file() and os.access(exe, os.X_OK)):
        return None
    try:
        res = _run.run([exe, "--list-devices"], timeout=120, check=False, what="llama-bench --list-devices")
    except TunerError:
        return None
    return parse_list_devices(res.output).get(backend)
