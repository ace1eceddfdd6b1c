"""One content hash for cache keys and ids, shared by every stage."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def stable_hash(*parts: object, n: int = 16) -> str:
    """sha256 over a canonical JSON encoding of ``parts``; the first ``n`` hex digits."""
    blob = json.dumps(parts, sort_keys=True, default=str, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:n]


def text_sha256(text: str) -> str:
    """sha256 hex digest of a text's UTF-8 bytes (the hashes a result's config.toml records)."""
    return hashlib.sha256(text.encode()).hexdigest()


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes (read in 1 MiB chunks: models and sdists are gigabytes)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
