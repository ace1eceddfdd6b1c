"""One content hash for cache keys and ids, shared by every stage."""

from __future__ import annotations

__all__ = ["file_sha256", "stable_hash"]

import hashlib
import json
from pathlib import Path
from typing import Any


def stable_hash(*parts: Any, n: int = 16) -> str:
    """sha256 over a canonical JSON encoding of ``parts``; the first ``n`` hex digits."""
    blob = json.dumps(parts, sort_keys=True, default=str, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:n]


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes (read in 1 MiB chunks: models and sdists are gigabytes)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
