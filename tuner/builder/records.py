"""Build records and the per-key build lock: ``build.json`` files and the artifact cache lookup."""

from __future__ import annotations

__all__ = ["cached_record", "load_build_record", "locked", "write_json"]

import contextlib
import fcntl
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any


def load_build_record(path: Path) -> dict[str, Any] | None:
    """A ``build.json`` (a build directory's latest attempt, or an artifact's record); None if absent."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` as JSON atomically (temporary file, then rename)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    tmp.replace(path)


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
    """Hold the key directory's exclusive lock (``root/.lock``) for the block."""
    # Parallel search workers may build candidates of one key; they share build/ and must take turns.
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def cached_record(art: Path, build_id: str, targets: Sequence[str]) -> dict[str, Any] | None:
    """The artifact's record when it was built ok for this build id (or carried here from another machine)
    and holds every target, else None."""
    rec = load_build_record(art / "build.json")
    if not rec or rec.get("status") != "ok":
        return None
    # A carried build (`tuner build --from-pack`) was compiled elsewhere: its id names that toolchain, and
    # it stands for this variant here until it is replaced.
    if rec.get("build_id") != build_id and not rec.get("carried"):
        return None
    if not all((art / "bin" / t).is_file() for t in targets):
        return None
    return rec
