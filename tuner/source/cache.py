"""The source cache under ``$TUNER_HOME/sources``: content-addressed trees (``<source_id>/llama.cpp``
and its ``source.json``), the SPEC index (``specs/<hash>.json``), and how an entry is added atomically.
Shared by :mod:`tuner.source.fetch` (trees it downloads) and :mod:`tuner.source.pack` (trees it unpacks)."""

from __future__ import annotations

import dataclasses
import datetime
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner._hash import stable_hash
from tuner.errors import TunerError
from tuner.paths import tuner_home
from tuner.source.spec import Source
from tuner.source.tree import find_era

# errno values that mean "the disk is full" (a quota counts the same for the user).
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def no_space_error(err: OSError | None, where: Path, *, path: str | None = None) -> TunerError:
    """The one-paragraph error for a full disk, naming the file being written when known."""
    path = path or (str(err.filename) if err is not None and err.filename else None) or str(where)
    return TunerError(
        f"No space left on device while writing {path}. Free space on that disk, or set TUNER_HOME (and TMPDIR, where "
        "pip unpacks) to a folder on a larger one, and run the command again."
    )


def sources_dir() -> Path:
    d = tuner_home() / "sources"
    d.mkdir(parents=True, exist_ok=True)
    return d


def index_file(spec: str) -> Path:
    return sources_dir() / "specs" / f"{stable_hash(spec)}.json"


def write_json(path: Path, data: Mapping[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def load_cached(source_id: str, spec: str) -> Source | None:
    entry = sources_dir() / source_id
    try:
        meta = json.loads((entry / "source.json").read_text())
    except (OSError, ValueError):
        return None
    if not (entry / "llama.cpp" / "CMakeLists.txt").is_file():
        return None
    return _entry_source(source_id, spec, meta, cached=True)


def _entry_source(source_id: str, spec: str, meta: dict[str, Any], *, cached: bool) -> Source:
    root = sources_dir() / source_id / "llama.cpp"
    return Source(
        spec=spec, source_id=source_id, root=root, commit=meta.get("commit"), era=meta["era"], cached=cached, meta=meta
    )


def staging_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix=".tmp-", dir=sources_dir()))
    path.chmod(0o755)  # mkdtemp makes it 0700; the cache entry should read like any folder
    return path


def commit_entry(staging: Path, source_id: str, spec: str, meta: dict[str, Any]) -> Source:
    """Atomically turn a staging folder holding ``llama.cpp/`` into ``sources/<source_id>``."""
    meta = {
        **meta,
        "spec": spec,
        "source_id": source_id,
        "era": find_era(staging / "llama.cpp"),
        "fetched_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    write_json(staging / "source.json", meta)
    try:
        os.rename(staging, sources_dir() / source_id)
    except OSError:
        # Someone else (another process, an earlier lost index) already has this content.
        shutil.rmtree(staging, ignore_errors=True)
        hit = load_cached(source_id, spec)
        if hit is None:
            raise
        return dataclasses.replace(hit, cached=False)
    return _entry_source(source_id, spec, meta, cached=False)
