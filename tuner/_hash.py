"""One content hash for cache keys and ids, shared by every stage."""

from __future__ import annotations

__all__ = ["stable_hash"]

import hashlib
import json
from typing import Any


def stable_hash(*parts: Any, n: int = 16) -> str:
    """sha256 over a canonical JSON encoding of ``parts``; the first ``n`` hex digits."""
    blob = json.dumps(parts, sort_keys=True, default=str, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:n]
