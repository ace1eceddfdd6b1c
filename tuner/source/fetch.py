"""The ``source`` stage: get the llama.cpp tree a SPEC names (:mod:`tuner.source.spec`) and identify it.

Fetched trees are cached, content-addressed, under ``$TUNER_HOME/sources/<source_id>/`` (the tree is
``llama.cpp/``, its record ``source.json``); ``$TUNER_HOME/sources/specs/<hash>.json`` maps a SPEC to its
source_id so fetching the same SPEC again does no work at all. The cache, the SPEC index and how an entry is
added atomically are shared with :mod:`tuner.source.pack` (trees it unpacks).
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner import log
from tuner._hash import file_sha256, stable_hash
from tuner._run import run
from tuner.errors import TunerError, UsageError
from tuner.paths import tuner_home
from tuner.source.spec import DEFAULT_SPEC, PYPI_NAME, Source, SourceSpec, parse_spec, require_tree
from tuner.source.tree import find_commit, find_era, git_head, git_output

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


logger = logging.getLogger(__name__)

_NO_SPACE_TEXT = re.compile(r"No space left on device(?:: '([^']+)')?|Disk quota exceeded(?:: '([^']+)')?")

# Files whose stat signature identifies a non-git tree (everything a build reads that matters).
_ID_PARTS = ("ggml", "src", "tools", "tests", "common", "include", "CMakeLists.txt")


def _no_space_in(text: str, where: Path) -> TunerError | None:
    """A full-disk error when a child's output says the disk filled (pip, git), else None."""
    m = _NO_SPACE_TEXT.search(text)
    return None if m is None else no_space_error(None, where, path=m.group(1) or m.group(2))


def fetch_source(spec: str | None = None, *, refresh: bool = False) -> Source:
    """Get the llama.cpp tree a SPEC names (default :data:`DEFAULT_SPEC`), from the cache when it is there.

    ``refresh``: ignore the SPEC index and resolve again (for a git branch that moved); the content-addressed
    tree is still reused when the content turns out the same. The Source's ``cached`` is True when nothing
    was downloaded, cloned or extracted.

    Raises UsageError for a bad SPEC, a version pip cannot find or an unsupported tree; TunerError when pip
    or git failed for another reason (network, disk).
    """
    parsed = parse_spec(spec)
    if parsed.scheme == "path":
        return _path_source(parsed)
    if not refresh and (hit := _indexed(parsed)) is not None:
        return hit
    try:
        src = _fetch_pypi(parsed) if parsed.scheme == "pypi" else _fetch_git(parsed)
        write_json(index_file(parsed.normalized), {"spec": parsed.normalized, "source_id": src.source_id})
    except OSError as err:
        if err.errno in NO_SPACE:
            raise no_space_error(err, sources_dir()) from err
        raise
    return src


def cached_source(spec: str) -> Source | None:
    """The tree a pypi: or git: SPEC names where the cache already holds it, else None; never downloads, clones or reads
    a ``path:`` folder (for checks of files from others, which must not reach out). UsageError for a bad SPEC.
    """
    parsed = parse_spec(spec)
    return None if parsed.scheme == "path" else _indexed(parsed)


def _indexed(parsed: SourceSpec) -> Source | None:
    norm = parsed.normalized
    index = index_file(norm)
    if not index.is_file():
        return None
    try:
        sid = json.loads(index.read_text())["source_id"]
    except (OSError, ValueError, KeyError):
        sid = None
    hit = load_cached(sid, norm) if isinstance(sid, str) and sid else None
    if hit is not None:
        logger.info("source %s: cached as %s", norm, sid)
    return hit


def run_pip_download(version: str, dest: Path) -> Path:
    """Download the llama-cpp-python ``version`` sdist into ``dest`` with pip; return its path.

    ``--no-build-isolation`` matters: pip prepares the sdist's metadata, and with isolation it would first build the
    backend's requirements (cmake!) from source because of ``--no-binary :all:``. Without isolation it uses the
    scikit-build-core tuner already depends on, and the whole download takes a few seconds.
    """
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation"]
    cmd += ["--disable-pip-version-check", "--progress-bar", "off", "-d", str(dest), f"{PYPI_NAME}=={version}"]
    log_file = dest / "pip-download.log"
    res = run(
        cmd,
        log_file=log_file,
        check=False,
        timeout=1800,
        what="pip download",
        on_line=lambda s: log.progress(s.strip()) if "Downloading" in s else None,
    )
    text = log_file.read_text(errors="replace") if log_file.is_file() else res.output
    if res.returncode != 0:
        if "No matching distribution" in text or "Could not find a version" in text:
            raise UsageError(
                f"pip found no sdist of {PYPI_NAME}=={version}. Check the version against '{sys.executable} -m pip "
                f"index versions {PYPI_NAME}' and pin one that exists, e.g. {DEFAULT_SPEC!r}."
            )
        if (full := _no_space_in(text, dest)) is not None:
            raise full
        last = "\n".join(text.splitlines()[-15:])
        raise TunerError(
            f"pip download of {PYPI_NAME}=={version} failed (exit {res.returncode}); check the "
            f"network or pip's index configuration. Last lines:\n{last}"
        )
    sdists = sorted(dest.glob("*.tar.gz"))
    if len(sdists) != 1:
        raise TunerError(
            f"pip download of {PYPI_NAME}=={version} left {len(sdists)} .tar.gz files in {dest}, expected 1."
        )
    return sdists[0]


def _fetch_pypi(parsed: SourceSpec) -> Source:
    norm = parsed.normalized
    staging = staging_dir()
    try:
        with log.step(f"Downloading {PYPI_NAME}=={parsed.value} sdist (pip)"):
            sdist = run_pip_download(parsed.value, staging / "download")
        digest = file_sha256(sdist)
        sid = digest[:16]
        if (hit := load_cached(sid, norm)) is not None:  # same bytes under another spec spelling / a lost index
            return hit
        with log.step(f"Extracting vendor/llama.cpp from {sdist.name}"):
            changelog = _extract_vendor_tree(sdist, staging / "llama.cpp")
        meta = {
            "sdist": sdist.name,
            "sdist_sha256": digest,
            "commit": find_commit(staging / "llama.cpp", changelog=changelog or ""),
        }
        shutil.rmtree(staging / "download")
        return commit_entry(staging, sid, norm, meta)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _extract_vendor_tree(sdist: Path, dest: Path) -> str | None:
    """Extract ``<top>/vendor/llama.cpp/`` of an sdist into ``dest``; return its CHANGELOG text."""
    raw = dest.parent / "raw"
    changelog: str | None = None
    top: str | None = None
    try:
        tar = tarfile.open(sdist, "r:*")
    except (OSError, tarfile.TarError) as err:
        raise TunerError(f"{sdist} is not a readable sdist tarball ({err}). Delete it and fetch again.") from err
    with tar:
        members = []
        for m in tar:
            parts = m.name.split("/")
            if top is None:
                top = parts[0]
            if m.name.startswith("/") or ".." in parts or parts[0] != top:
                raise TunerError(f"{sdist} has an unsafe member path {m.name!r}; refusing to extract it.")
            if len(parts) == 2 and parts[1] == "CHANGELOG.md" and m.isfile():
                fh = tar.extractfile(m)
                changelog = fh.read().decode("utf-8", "replace") if fh else None
            if parts[1:3] == ["vendor", "llama.cpp"] and len(parts) > 3:
                if m.issym() or m.islnk():
                    continue  # none in real sdists; links are how extraction escapes a folder
                members.append(m)
                if len(members) % 2000 == 0:
                    log.progress(f"    {len(members)} files")
        if not members:
            raise UsageError(f"{sdist} has no vendor/llama.cpp/ folder; it is not a llama-cpp-python sdist.")
        if hasattr(tarfile, "data_filter"):
            tar.extractall(raw, members=members, filter="data")
        else:  # Python < 3.11.4: paths were checked above and links skipped
            tar.extractall(raw, members=members)
    os.rename(raw / str(top) / "vendor" / "llama.cpp", dest)
    shutil.rmtree(raw, ignore_errors=True)
    return changelog


def _fetch_git(parsed: SourceSpec) -> Source:
    norm = parsed.normalized
    staging = staging_dir()
    tree = staging / "llama.cpp"
    try:
        with log.step(f"Cloning {parsed.value} at {parsed.ref}"):
            argv = ["git", "clone", "--quiet", "--no-checkout", "--", parsed.value, str(tree)]
            res = run(argv, check=False, timeout=3600, what="git clone")
            if res.returncode != 0:
                if (full := _no_space_in(res.output, tree)) is not None:
                    raise full
                raise TunerError(
                    f"git clone of {parsed.value} failed (exit {res.returncode}: "
                    f"{res.output.strip()[-2000:]}). Check the URL, the network and your git credentials."
                )
            argv = ["git", "-C", str(tree), "checkout", "--quiet", "--detach", parsed.ref]
            res = run(argv, check=False, what="git checkout", timeout=600)
            if res.returncode != 0:
                raise UsageError(
                    f"git: {parsed.value} has no revision {parsed.ref!r} ({res.output.strip()}). "
                    "Give a branch, tag or commit that exists in that repository."
                )
            commit = run(["git", "-C", str(tree), "rev-parse", "HEAD"], what="git rev-parse").output.strip()
        sid = commit[:16]
        if (hit := load_cached(sid, norm)) is not None:
            return hit
        require_tree(tree, norm)
        # The cache is a plain tree; the commit is recorded in source.json.
        shutil.rmtree(tree / ".git", ignore_errors=True)
        return commit_entry(staging, sid, norm, {"url": parsed.value, "ref": parsed.ref, "commit": commit})
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _tree_signature(root: Path) -> list[tuple[str, int, int]]:
    sig = []
    for part in _ID_PARTS:
        p = root / part
        paths = [p] if p.is_file() else sorted(x for x in p.rglob("*") if x.is_file()) if p.is_dir() else []
        for f in paths:
            st = f.stat()
            sig.append((f.relative_to(root).as_posix(), st.st_size, st.st_mtime_ns))
    return sig


def _path_source(parsed: SourceSpec) -> Source:
    root = Path(parsed.value)
    head = git_head(root)
    if head:
        diff = git_output(root, "diff", "HEAD", "--binary") or ""
        untracked = git_output(root, "ls-files", "--others", "--exclude-standard") or ""
        sig = [
            (u, (root / u).stat().st_size, (root / u).stat().st_mtime_ns)
            for u in untracked.splitlines()
            if (root / u).is_file()
        ]
        sid = stable_hash("git", head, hashlib.sha256(diff.encode()).hexdigest(), sig)
    else:
        sid = stable_hash("files", _tree_signature(root))
    return Source(
        spec=parsed.normalized,
        source_id=sid,
        root=root,
        commit=find_commit(root),
        era=find_era(root),
        cached=True,
        meta={"git_head": head},
    )
