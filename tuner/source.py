"""The ``source`` stage: get a llama.cpp tree, identify it, and describe what it can be tuned with.

A SPEC names where the tree comes from:

- ``pypi:llama-cpp-python==X`` -- the llama-cpp-python sdist, whose ``vendor/llama.cpp`` is the
  tree (downloaded with pip, so pip's index configuration, proxy and cache apply);
- ``git:URL@REF`` -- a clone of URL checked out at REF;
- ``path:DIR`` -- a local llama.cpp checkout, used in place.

Fetched trees are cached, content-addressed, under ``$TUNER_HOME/sources/<source_id>/`` (the tree
is ``llama.cpp/``, its record ``source.json``); ``$TUNER_HOME/sources/specs/<hash>.json`` maps a
SPEC to its source_id so fetching the same SPEC again does no work at all.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_SPEC",
    "ERAS",
    "CMakeOption",
    "Source",
    "SourceSpec",
    "parse_spec",
    "fetch_source",
    "find_commit",
    "find_era",
    "load_cmake_options",
    "parse_cmake_commands",
    "source_info",
    "pack_source",
    "unpack_source",
    "run_pip_download",
]

import dataclasses
import datetime
import hashlib
import io
import json
import logging
import os
import re
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tuner import log
from tuner._run import run
from tuner.errors import TunerError, UsageError, close_matches
from tuner.paths import tuner_home
from tuner.variant import stable_hash

logger = logging.getLogger(__name__)

DEFAULT_SPEC = "pypi:llama-cpp-python==0.3.36"
ERAS = ("mma", "rocwmma")
_SCHEMES = ("pypi", "git", "path")
_PYPI_NAME = "llama-cpp-python"
_CUDA_DIR = "ggml/src/ggml-cuda"
_WMMA_FILES = ("fattn-wmma-f16.cu", "fattn-wmma-f16.cuh")
_MMA_FILE = "fattn-mma-f16.cuh"
_ROCWMMA_OPTION = "GGML_HIP_ROCWMMA_FATTN"
# Files whose stat signature identifies a non-git tree (everything a build reads that matters).
_ID_PARTS = ("ggml", "src", "tools", "tests", "common", "include", "CMakeLists.txt")
_VERSION_RE = re.compile(r"^[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?$")
_COMMIT_RE = re.compile(r"llama\.cpp@([0-9a-fA-F]{7,40})\b")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SourceSpec:
    """A parsed SPEC."""

    scheme: str
    """``pypi``, ``git`` or ``path``."""
    value: str
    """pypi: the version; git: the URL; path: the absolute directory."""
    ref: str = ""
    """git only: the branch, tag or commit to check out."""

    @property
    def normalized(self) -> str:
        if self.scheme == "pypi":
            return f"pypi:{_PYPI_NAME}=={self.value}"
        if self.scheme == "git":
            return f"git:{self.value}@{self.ref}"
        return f"path:{self.value}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Source:
    """A llama.cpp tree ready to render and build against."""

    spec: str
    """Normalized SPEC."""
    source_id: str
    """Content id (16 hex): sdist sha256, git commit, or a hash of a local tree's state."""
    root: Path
    """The llama.cpp tree: has CMakeLists.txt and ggml/."""
    commit: str | None
    """Upstream llama.cpp commit named by the sdist CHANGELOG or by git; None when unknown."""
    era: str
    """``rocwmma`` (has fattn-wmma-f16 and GGML_HIP_ROCWMMA_FATTN) or ``mma``."""
    cached: bool = False
    """True when this call found everything in the cache and did no work."""
    meta: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False)
    """The rest of source.json: sdist sha256, fetched_at, ..."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class CMakeOption:
    """One cache entry a llama.cpp tree declares: ``option()`` or ``set(... CACHE TYPE ...)``."""

    name: str
    default: str
    """The default as written, without quotes: ``OFF``, ``size``, ``${GGML_STANDALONE}``."""
    resolved: str | None
    """``default`` with variables substituted where that is simple (see load_cmake_options)."""
    help: str
    kind: str
    """``BOOL`` for option(); the cache type (``STRING``, ``PATH``, ``FILEPATH``) for set()."""
    file: str
    """Path relative to the tree root."""
    line: int
    conditional: bool = False
    """Declared inside an if() block, so it may not exist on every platform."""


# --------------------------------------------------------------------------------------------
# SPEC parsing


def parse_spec(spec: str | None = None) -> SourceSpec:
    """Parse a SPEC string; see the module docstring for the forms.

    Raises:
        UsageError: unknown scheme, unpinned or malformed pypi requirement, another package,
            a git spec without ``@REF``, or a path that is missing or not a llama.cpp tree.
    """
    spec = (spec or DEFAULT_SPEC).strip()
    scheme, sep, rest = spec.partition(":")
    if not sep or scheme not in _SCHEMES:
        hint = close_matches(scheme, _SCHEMES) if sep else ""
        msg = (
            f"SPEC {spec!r} has no known scheme.{hint} Use one of "
            f"'pypi:{_PYPI_NAME}==VERSION' (e.g. {DEFAULT_SPEC!r}), 'git:URL@REF' "
            "(e.g. 'git:https://github.com/ggml-org/llama.cpp@b6129') or 'path:DIR' "
            "(a local llama.cpp checkout)."
        )
        raise UsageError(msg)
    if scheme == "pypi":
        return _parse_pypi(spec, rest)
    if scheme == "git":
        url, at, ref = rest.rpartition("@")
        # "git@host:repo" has an '@' in the URL itself; the REF is after the last '@' and
        # never contains ':' or '/'-less host parts, so require a non-empty URL and REF.
        if not at or not url or not ref or ":" in ref:
            msg = (
                f"SPEC {spec!r} does not name a revision. Write 'git:URL@REF' with a branch, "
                "tag or commit after the last '@', e.g. "
                "'git:https://github.com/ggml-org/llama.cpp@b6129'."
            )
            raise UsageError(msg)
        if url.startswith("-") or ref.startswith("-"):
            msg = f"SPEC {spec!r}: a git URL or REF may not start with '-' (it would read as a git option)."
            raise UsageError(msg)
        return SourceSpec(scheme="git", value=url, ref=ref)
    path = Path(rest).expanduser()
    if not rest or not path.is_dir():
        msg = (
            f"SPEC {spec!r}: directory {rest!r} does not exist. Give the path of a llama.cpp "
            "checkout (the folder holding CMakeLists.txt and ggml/), e.g. 'path:~/src/llama.cpp'."
        )
        raise UsageError(msg)
    path = path.resolve()
    _require_tree(path, spec)
    return SourceSpec(scheme="path", value=str(path))


def _parse_pypi(spec: str, req: str) -> SourceSpec:
    name, eq, version = req.partition("==")
    name, version = name.strip(), version.strip()
    bad_op = re.search(r"(>=|<=|~=|!=|===|>|<)", req)
    if not eq or bad_op or not name:
        msg = (
            f"SPEC {spec!r} is not pinned. Only exact pins are allowed, because the tree must "
            f"not change under a cached id: write 'pypi:{_PYPI_NAME}==VERSION', "
            f"e.g. {DEFAULT_SPEC!r}."
        )
        raise UsageError(msg)
    if re.sub(r"[-_.]+", "-", name).lower() != _PYPI_NAME:
        msg = (
            f"SPEC {spec!r} names package {name!r}; only {_PYPI_NAME!r} vendors llama.cpp in its "
            f"sdist. Write 'pypi:{_PYPI_NAME}==VERSION', or use 'git:URL@REF' / 'path:DIR' for "
            "other trees."
        )
        raise UsageError(msg)
    if not _VERSION_RE.match(version):
        msg = (
            f"SPEC {spec!r}: {version!r} is not a release version. Write a version such as "
            "'0.3.36' (see https://pypi.org/project/llama-cpp-python/#history)."
        )
        raise UsageError(msg)
    return SourceSpec(scheme="pypi", value=version)


def _require_tree(root: Path, spec: str) -> None:
    missing = [p for p in ("CMakeLists.txt", "ggml/CMakeLists.txt") if not (root / p).is_file()]
    if missing:
        msg = (
            f"SPEC {spec!r}: {root} is not a llama.cpp tree ({' and '.join(missing)} missing). "
            "Point at the top of a llama.cpp checkout, the folder holding CMakeLists.txt and ggml/ "
            "(in a llama-cpp-python checkout that is vendor/llama.cpp)."
        )
        raise UsageError(msg)


# --------------------------------------------------------------------------------------------
# Era and commit


def find_era(root: Path) -> str:
    """``rocwmma`` or ``mma``, from the FlashAttention files and CMake options the tree has.

    Raises:
        UsageError: the tree has neither layout.
    """
    cuda = root / _CUDA_DIR
    has_wmma = any((cuda / f).is_file() for f in _WMMA_FILES)
    has_mma = (cuda / _MMA_FILE).is_file()
    declares_rocwmma = _ROCWMMA_OPTION in load_cmake_options(root) if has_wmma else False
    if has_wmma and declares_rocwmma:
        return "rocwmma"
    if has_mma and not has_wmma:
        return "mma"
    found = "fattn-wmma-f16 without the option" if has_wmma else "neither kernel file"
    msg = (
        f"The llama.cpp tree at {root} is not supported: looked for {_CUDA_DIR}/{_WMMA_FILES[0]}(h) "
        f"with the CMake option {_ROCWMMA_OPTION} (era 'rocwmma') or {_CUDA_DIR}/{_MMA_FILE} "
        f"without rocWMMA (era 'mma'), and found {found}. Use a llama.cpp from 2025-06 or later "
        f"(e.g. {DEFAULT_SPEC!r} or 'pypi:llama-cpp-python==0.3.16')."
    )
    raise UsageError(msg)


def find_commit(root: Path, *, changelog: str | None = None) -> str | None:
    """The upstream llama.cpp commit of a tree, or None.

    Tries, in order: the CHANGELOG text of an sdist (its newest release section names
    ``llama.cpp@<hash>``), ``git rev-parse HEAD`` when ``root`` is itself a git work tree, and the
    CHANGELOG of a llama-cpp-python sdist or checkout that ``root`` is the ``vendor/llama.cpp`` of.
    """
    if changelog is not None:
        return _commit_from_changelog(changelog)
    head = _git_head(root)
    if head:
        return head
    parent = root.parent.parent
    if root.parent.name == "vendor" and (parent / "CHANGELOG.md").is_file():
        try:
            return _commit_from_changelog((parent / "CHANGELOG.md").read_text(errors="replace"))
        except OSError:
            return None
    return None


def _commit_from_changelog(text: str) -> str | None:
    # Sections are "## [X.Y.Z]"; the first one with a number is the newest release.
    sections = re.split(r"^## ", text, flags=re.MULTILINE)
    for sec in sections[1:]:
        if sec.startswith("[Unreleased]"):
            continue
        m = _COMMIT_RE.search(sec)
        return m.group(1).lower() if m else None
    return None


def _git(root: Path, *args: str) -> str | None:
    """Output of a git command in ``root``, or None when git or the repository is absent."""
    try:
        res = run(["git", "-C", str(root), *args], check=False, what="git", timeout=60)
    except TunerError:  # git not installed
        return None
    return res.output if res.returncode == 0 else None


def _git_head(root: Path) -> str | None:
    top = _git(root, "rev-parse", "--show-toplevel")
    # Only when root *is* the work tree: vendor/llama.cpp inside a llama-cpp-python checkout has
    # the wrapper's HEAD, which is not a llama.cpp commit.
    if not top or Path(top.strip()).resolve() != root.resolve():
        return None
    head = _git(root, "rev-parse", "HEAD")
    return head.strip() if head else None


# --------------------------------------------------------------------------------------------
# CMake options

_BRACKET_COMMENT = re.compile(r"#\[(=*)\[.*?\]\1\]", re.DOTALL)
_CACHE_TYPES = ("BOOL", "STRING", "PATH", "FILEPATH")
# What a tuner build is: llama.cpp is the top-level project and ggml a subdirectory of it.
_STANDALONE_FACTS = {"LLAMA_STANDALONE": "ON", "GGML_STANDALONE": "OFF"}


def parse_cmake_commands(text: str) -> Iterator[tuple[str, list[str], int, int]]:
    """Yield ``(command, args, line, if_depth)`` for each CMake command call in ``text``.

    A small tokenizer, enough for option()/set(): handles comments, quoted arguments with
    escapes, nested parentheses and calls spread over several lines. ``if_depth`` counts the
    enclosing ``if()`` blocks.
    """
    text = _BRACKET_COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    i, n, line, depth = 0, len(text), 1, 0
    ident = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif c == "#":
            while i < n and text[i] != "\n":
                i += 1
        elif c.isalpha() or c == "_":
            m = ident.match(text, i)
            assert m is not None
            name, j = m.group(0).lower(), m.end()
            while j < n and text[j] in " \t":
                j += 1
            if j >= n or text[j] != "(":
                i = m.end()
                continue
            start_line = line
            args, i, line = _parse_args(text, j + 1, line)
            if name == "endif":
                depth = max(0, depth - 1)
            yield name, args, start_line, depth
            if name == "if":
                depth += 1
        else:
            i += 1


def _parse_args(text: str, i: int, line: int) -> tuple[list[str], int, int]:
    args: list[str] = []
    n, level, cur, have = len(text), 0, [], False
    while i < n:
        c = text[i]
        if c == '"':
            i += 1
            have = True
            while i < n and text[i] != '"':
                if text[i] == "\\" and i + 1 < n:
                    nxt = text[i + 1]
                    cur.append({"n": "\n", "t": "\t", '"': '"', "\\": "\\"}.get(nxt, "\\" + nxt))
                    i += 2
                    continue
                if text[i] == "\n":
                    line += 1
                cur.append(text[i])
                i += 1
            i += 1
        elif c == "#" and level == 0 and not cur:
            while i < n and text[i] != "\n":
                i += 1
        elif c in " \t\r\n":
            if c == "\n":
                line += 1
            if have:
                args.append("".join(cur))
                cur, have = [], False
            i += 1
        elif c == "(":
            level += 1
            cur.append(c)
            have = True
            i += 1
        elif c == ")":
            if level == 0:
                if have:
                    args.append("".join(cur))
                return args, i + 1, line
            level -= 1
            cur.append(c)
            i += 1
        else:
            cur.append(c)
            have = True
            i += 1
    return args, i, line


def _cmake_files(root: Path) -> list[Path]:
    files = [root / "CMakeLists.txt", root / "ggml" / "CMakeLists.txt"]
    files += sorted((root / "ggml" / "cmake").glob("*.cmake"))
    src = root / "ggml" / "src"
    if src.is_dir():
        for pattern in ("CMakeLists.txt", "*.cmake"):
            files += sorted(p for p in src.rglob(pattern) if "vendor" not in p.relative_to(src).parts)
    return [f for f in files if f.is_file()]


def load_cmake_options(root: Path) -> dict[str, CMakeOption]:
    """Every ``option()`` and ``set(NAME value CACHE TYPE "help")`` the tree declares.

    Scans the top-level CMakeLists.txt, ggml/CMakeLists.txt, ggml/cmake/*.cmake and every
    CMakeLists.txt / *.cmake under ggml/src (not vendored code). The first declaration of a name
    wins (the top-level one is what a llama.cpp build sees); a name declared again with another
    default (if/else branches) gets ``resolved=None``. ``FORCE``d and ``INTERNAL`` cache
    entries are overrides, not declarations, and are skipped.

    ``resolved`` substitutes ``${VAR}`` when VAR is another declared option, a variable every
    plain ``set(VAR value)`` in these files gives the same literal, or LLAMA_STANDALONE (ON) /
    GGML_STANDALONE (OFF) -- llama.cpp is always the top-level project in a tuner build.
    Otherwise it is None.
    """
    found: dict[str, CMakeOption] = {}
    plain: dict[str, set[str]] = {}
    ambiguous: set[str] = set()
    for path in _cmake_files(root):
        rel = path.relative_to(root).as_posix()
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for cmd, args, line, depth in parse_cmake_commands(text):
            if cmd == "option" and len(args) >= 2:
                name, help_, default = args[0], args[1], args[2] if len(args) > 2 else "OFF"
                kind = "BOOL"
            elif cmd == "set" and len(args) >= 2 and "CACHE" in args[1:]:
                k = args.index("CACHE", 1)
                if k + 1 >= len(args) or args[k + 1] not in _CACHE_TYPES or "FORCE" in args[k:]:
                    continue
                name, default, kind = args[0], ";".join(args[1:k]), args[k + 1]
                help_ = args[k + 2] if k + 2 < len(args) else ""
            else:
                if cmd == "set" and len(args) == 2:
                    plain.setdefault(args[0], set()).add(args[1])
                continue
            if name.startswith("CMAKE_"):
                continue
            if name in found:
                if found[name].default != default:  # e.g. ON/OFF in if()/else() branches
                    ambiguous.add(name)
                continue
            found[name] = CMakeOption(
                name=name, default=default, resolved=None, help=help_, kind=kind,
                file=rel, line=line, conditional=depth > 0,
            )
    facts = {k: next(iter(v)) for k, v in plain.items() if len(v) == 1}
    facts.update(_STANDALONE_FACTS)
    resolved: dict[str, str | None] = {}

    def resolve(name: str, seen: frozenset[str]) -> str | None:
        if name in resolved:
            return resolved[name]
        if name in ambiguous:
            resolved[name] = None
            return None
        raw = found[name].default
        out: str | None = raw
        for var in re.findall(r"\$\{([A-Za-z0-9_]+)\}", raw):
            if var in found and var not in seen:
                val = resolve(var, seen | {var})
            else:
                val = facts.get(var)
            if val is None or "${" in val:
                out = None
                break
            assert out is not None
            out = out.replace("${" + var + "}", val)
        resolved[name] = out
        return out

    return {n: dataclasses.replace(o, resolved=resolve(n, frozenset({n}))) for n, o in found.items()}


# --------------------------------------------------------------------------------------------
# Fetching


def _sources_dir() -> Path:
    d = tuner_home() / "sources"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _index_file(spec: str) -> Path:
    return _sources_dir() / "specs" / f"{stable_hash(spec)}.json"


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _load_cached(source_id: str, spec: str) -> Source | None:
    entry = _sources_dir() / source_id
    try:
        meta = json.loads((entry / "source.json").read_text())
    except (OSError, ValueError):
        return None
    root = entry / "llama.cpp"
    if not (root / "CMakeLists.txt").is_file():
        return None
    return Source(
        spec=spec, source_id=source_id, root=root, commit=meta.get("commit"),
        era=meta["era"], cached=True, meta=meta,
    )


def fetch_source(spec: str | None = None, *, refresh: bool = False) -> Source:
    """Get the llama.cpp tree a SPEC names, from the cache when it is there.

    Args:
        spec: ``pypi:llama-cpp-python==X`` (default :data:`DEFAULT_SPEC`), ``git:URL@REF`` or
            ``path:DIR``.
        refresh: Ignore the SPEC index and resolve again (for a git branch that moved). The
            content-addressed tree is still reused when the content turns out the same.

    Returns:
        The Source; ``cached`` is True when nothing was downloaded, cloned or extracted.

    Raises:
        UsageError: a bad SPEC, a version pip cannot find, or an unsupported tree.
        TunerError: pip or git failed for another reason (network, disk).
    """
    parsed = parse_spec(spec)
    norm = parsed.normalized
    if parsed.scheme == "path":
        return _path_source(parsed)
    index = _index_file(norm)
    if not refresh and index.is_file():
        try:
            sid = json.loads(index.read_text())["source_id"]
        except (OSError, ValueError, KeyError):
            sid = None
        hit = _load_cached(sid, norm) if sid else None
        if hit is not None:
            logger.info("source %s: cached as %s", norm, sid)
            return hit
    src = _fetch_pypi(parsed) if parsed.scheme == "pypi" else _fetch_git(parsed)
    _write_json(index, {"spec": norm, "source_id": src.source_id})
    return src


def _staging() -> Path:
    path = Path(tempfile.mkdtemp(prefix=".tmp-", dir=_sources_dir()))
    path.chmod(0o755)  # mkdtemp makes it 0700; the cache entry should read like any folder
    return path


def _commit_entry(staging: Path, source_id: str, spec: str, meta: dict[str, Any]) -> Source:
    """Atomically turn a staging folder holding ``llama.cpp/`` into ``sources/<source_id>``."""
    era = find_era(staging / "llama.cpp")
    meta = {**meta, "spec": spec, "source_id": source_id, "era": era,
            "fetched_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    _write_json(staging / "source.json", meta)
    final = _sources_dir() / source_id
    try:
        os.rename(staging, final)
    except OSError:
        # Someone else (another process, an earlier lost index) already has this content.
        shutil.rmtree(staging, ignore_errors=True)
        hit = _load_cached(source_id, spec)
        if hit is None:
            raise
        return dataclasses.replace(hit, cached=False)
    return Source(spec=spec, source_id=source_id, root=final / "llama.cpp",
                  commit=meta.get("commit"), era=era, cached=False, meta=meta)


def run_pip_download(version: str, dest: Path) -> Path:
    """Download the llama-cpp-python ``version`` sdist into ``dest`` with pip; return its path.

    ``--no-build-isolation`` matters: pip prepares the sdist's metadata, and with isolation it
    would first build the backend's requirements (cmake!) from source because of
    ``--no-binary :all:``. Without isolation it uses the scikit-build-core tuner already depends
    on, and the whole download takes a few seconds.
    """
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
        "--no-build-isolation", "--disable-pip-version-check", "--progress-bar", "off",
        "-d", str(dest), f"{_PYPI_NAME}=={version}",
    ]
    log_file = dest / "pip-download.log"
    res = run(cmd, log_file=log_file, check=False, timeout=1800, what="pip download",
              on_line=lambda s: log.progress(s.strip()) if "Downloading" in s else None)
    text = log_file.read_text(errors="replace") if log_file.is_file() else res.output
    if res.returncode != 0:
        if "No matching distribution" in text or "Could not find a version" in text:
            msg = (
                f"pip found no sdist of {_PYPI_NAME}=={version}. Check the version against "
                f"'{sys.executable} -m pip index versions {_PYPI_NAME}' and pin one that exists, "
                f"e.g. {DEFAULT_SPEC!r}."
            )
            raise UsageError(msg)
        last = "\n".join(text.splitlines()[-15:])
        msg = (f"pip download of {_PYPI_NAME}=={version} failed (exit {res.returncode}); check the "
               f"network or pip's index configuration. Last lines:\n{last}")
        raise TunerError(msg)
    sdists = sorted(dest.glob("*.tar.gz"))
    if len(sdists) != 1:
        msg = f"pip download of {_PYPI_NAME}=={version} left {len(sdists)} .tar.gz files in {dest}, expected 1."
        raise TunerError(msg)
    return sdists[0]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fetch_pypi(parsed: SourceSpec) -> Source:
    norm = parsed.normalized
    staging = _staging()
    try:
        with log.step(f"Downloading {_PYPI_NAME}=={parsed.value} sdist (pip)"):
            sdist = run_pip_download(parsed.value, staging / "download")
        digest = _sha256(sdist)
        sid = digest[:16]
        hit = _load_cached(sid, norm)
        if hit is not None:  # same bytes under another spec spelling / a lost index
            return hit
        with log.step(f"Extracting vendor/llama.cpp from {sdist.name}"):
            changelog = _extract_vendor_tree(sdist, staging / "llama.cpp")
        meta = {"sdist": sdist.name, "sdist_sha256": digest,
                "commit": find_commit(staging / "llama.cpp", changelog=changelog or "")}
        shutil.rmtree(staging / "download")
        return _commit_entry(staging, sid, norm, meta)
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
        msg = f"{sdist} is not a readable sdist tarball ({err}). Delete it and fetch again."
        raise TunerError(msg) from err
    with tar:
        members = []
        count = 0
        for m in tar:
            parts = m.name.split("/")
            if top is None:
                top = parts[0]
            if m.name.startswith("/") or ".." in parts or parts[0] != top:
                msg = f"{sdist} has an unsafe member path {m.name!r}; refusing to extract it."
                raise TunerError(msg)
            if len(parts) == 2 and parts[1] == "CHANGELOG.md" and m.isfile():
                fh = tar.extractfile(m)
                changelog = fh.read().decode("utf-8", "replace") if fh else None
            if parts[1:3] == ["vendor", "llama.cpp"] and len(parts) > 3:
                if m.issym() or m.islnk():
                    continue  # none in real sdists; links are how extraction escapes a folder
                members.append(m)
                count += 1
                if count % 2000 == 0:
                    log.progress(f"    {count} files")
        if not members:
            msg = f"{sdist} has no vendor/llama.cpp/ folder; it is not a llama-cpp-python sdist."
            raise UsageError(msg)
        if hasattr(tarfile, "data_filter"):
            tar.extractall(raw, members=members, filter="data")
        else:  # Python < 3.11.4: paths were checked above and links skipped
            tar.extractall(raw, members=members)  # noqa: S202
    os.rename(raw / str(top) / "vendor" / "llama.cpp", dest)
    shutil.rmtree(raw, ignore_errors=True)
    return changelog


def _fetch_git(parsed: SourceSpec) -> Source:
    norm = parsed.normalized
    staging = _staging()
    tree = staging / "llama.cpp"
    try:
        with log.step(f"Cloning {parsed.value} at {parsed.ref}"):
            res = run(["git", "clone", "--quiet", "--no-checkout", "--", parsed.value, str(tree)],
                      check=False, timeout=3600, what="git clone")
            if res.returncode != 0:
                msg = (f"git clone of {parsed.value} failed (exit {res.returncode}: "
                       f"{res.output.strip()[-2000:]}). Check the URL, the network and your git credentials.")
                raise TunerError(msg)
            res = run(["git", "-C", str(tree), "checkout", "--quiet", "--detach", parsed.ref],
                      check=False, what="git checkout", timeout=600)
            if res.returncode != 0:
                msg = (f"git: {parsed.value} has no revision {parsed.ref!r} ({res.output.strip()}). "
                       "Give a branch, tag or commit that exists in that repository.")
                raise UsageError(msg)
            commit = run(["git", "-C", str(tree), "rev-parse", "HEAD"], what="git rev-parse").output.strip()
        sid = commit[:16]
        hit = _load_cached(sid, norm)
        if hit is not None:
            return hit
        _require_tree(tree, norm)
        # The cache is a plain tree; the commit is recorded in source.json.
        shutil.rmtree(tree / ".git", ignore_errors=True)
        return _commit_entry(staging, sid, norm, {"url": parsed.value, "ref": parsed.ref, "commit": commit})
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
    head = _git_head(root)
    if head:
        diff = _git(root, "diff", "HEAD", "--binary") or ""
        untracked = _git(root, "ls-files", "--others", "--exclude-standard") or ""
        sig = [(u, (root / u).stat().st_size, (root / u).stat().st_mtime_ns)
               for u in untracked.splitlines() if (root / u).is_file()]
        sid = stable_hash("git", head, hashlib.sha256(diff.encode()).hexdigest(), sig)
    else:
        sid = stable_hash("files", _tree_signature(root))
    return Source(spec=parsed.normalized, source_id=sid, root=root, commit=find_commit(root),
                  era=find_era(root), cached=True, meta={"git_head": head})


# --------------------------------------------------------------------------------------------
# Describing a tree

_TILE_TABLE_RE = re.compile(r"ggml_cuda_fattn_tile_get_config_(\w+)\s*\(const int DKQ")
_MMA_TABLE_RE = re.compile(r"ggml_cuda_fattn_mma_get_config_(\w+)\s*\(const int DKQ")
_B_MMA_SPEC_RE = re.compile(r"struct\s+fattn_mma_f16_config\s*<\s*(\d+)\s*,\s*(\d+)\s*>")


def _table_rows(text: str, regex: re.Pattern[str], case_macro: str) -> dict[str, int]:
    """Row counts of each ``static constexpr ... get_config_<name>(...) { CASE(...) ... }``."""
    out: dict[str, int] = {}
    for m in regex.finditer(text):
        body_start = text.find("{", m.end())
        body_end = text.find("\n}", body_start)
        if body_start < 0 or body_end < 0:
            continue
        out[m.group(1)] = len(re.findall(rf"^\s*{case_macro}\s*\(", text[body_start:body_end], re.MULTILINE))
    return out


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def source_info(src: Source) -> dict[str, Any]:
    """What ``tuner source info --json`` prints: identity, CMake options, FA kernels and tables."""
    root = src.root
    cuda = root / _CUDA_DIR
    names = sorted(p.name for p in cuda.glob("fattn*")) if cuda.is_dir() else []
    kernels = {
        "VEC": any(n.startswith("fattn-vec") for n in names),
        "TILE": any(n.startswith("fattn-tile") for n in names),
        "MMA": any(n.startswith("fattn-mma-f16") for n in names),
        "WMMA": any(n.startswith("fattn-wmma-f16") for n in names),
    }
    tables: dict[str, Any] = {}
    tile_text = _read(cuda / "fattn-tile.cuh")
    mma_text = _read(cuda / _MMA_FILE)
    tile = _table_rows(tile_text, _TILE_TABLE_RE, "GGML_CUDA_FATTN_TILE_CONFIG_CASE")
    mma = _table_rows(mma_text, _MMA_TABLE_RE, "GGML_CUDA_FATTN_MMA_CONFIG_CASE")
    if tile:
        tables["tile"] = {"file": f"{_CUDA_DIR}/fattn-tile.cuh", "rows": tile}
    if mma:
        tables["mma"] = {"file": f"{_CUDA_DIR}/{_MMA_FILE}", "rows": mma}
    specs = [f"{a}x{b}" for a, b in _B_MMA_SPEC_RE.findall(mma_text)]
    if specs:
        tables["mma_f16_config"] = {"file": f"{_CUDA_DIR}/{_MMA_FILE}", "specializations": specs}
    wmma = [f"{_CUDA_DIR}/{f}" for f in _WMMA_FILES if (cuda / f).is_file()]
    if wmma:
        tables["wmma"] = {"files": wmma}
    instances: dict[str, int] = {}
    for p in sorted((cuda / "template-instances").glob("fattn-*.cu")):
        fam = re.sub(r"-instance.*$", "", p.stem)
        instances[fam] = instances.get(fam, 0) + 1
    tools = {
        "llama-bench": (root / "tools/llama-bench/llama-bench.cpp").is_file(),
        "test-backend-ops": (root / "tests/test-backend-ops.cpp").is_file(),
        "llama-quantize": (root / "tools/quantize/quantize.cpp").is_file(),
    }
    opts = load_cmake_options(root)
    return {
        "spec": src.spec,
        "source_id": src.source_id,
        "root": str(root),
        "commit": src.commit,
        "era": src.era,
        "fa_kernels": kernels,
        "fa_files": names,
        "config_tables": tables,
        "fa_instances": instances,
        "tools": tools,
        "options": {
            n: {"default": o.default, "resolved": o.resolved, "help": o.help, "kind": o.kind,
                "file": o.file, "line": o.line, "conditional": o.conditional}
            for n, o in sorted(opts.items())
        },
    }


# --------------------------------------------------------------------------------------------
# Packing

# Top-level entries a CPU/CUDA/HIP build of llama-bench, test-backend-ops and llama-quantize
# needs (examples/, pocs/ and app/ are add_subdirectory'd unconditionally: configure fails without).
_PACK_KEEP = ("CMakeLists.txt", "CMakePresets.json", "LICENSE", "cmake", "common", "ggml", "gguf-py",
              "include", "licenses", "src", "tests", "tools", "vendor", "examples", "pocs", "app")
_PACK_MODELS = ("ggml-vocab-llama-bpe.gguf", "ggml-vocab-qwen2.gguf")
# Backends under ggml/src worth carrying; the others (vulkan, sycl, metal, ...) are big and only
# add_subdirectory'd when their option is ON.
_PACK_BACKENDS = ("ggml-cpu", "ggml-cuda", "ggml-hip", "ggml-blas", "ggml-rpc")


def _pack_keep(rel: str, is_dir: bool) -> bool:
    """Whether the trimmed pack keeps the tree entry ``rel`` (a file, or a folder when ``is_dir``)."""
    parts = rel.split("/")
    if parts[0] == "models":
        return len(parts) == 1 or (len(parts) == 2 and parts[1] in _PACK_MODELS)
    if parts[0] not in _PACK_KEEP or ".git" in parts:
        return False
    if parts[:2] == ["ggml", "src"] and len(parts) > 2 and parts[2].startswith("ggml-"):
        if (is_dir or len(parts) > 3) and parts[2] not in _PACK_BACKENDS:
            return False
    if parts[:2] == ["tools", "ui"]:
        return False
    if parts[:2] == ["tools", "server"] and len(parts) > 2 and parts[2].startswith("public"):
        return False
    return True


def pack_source(src: Source, out: Path, *, trim: bool = True) -> Path:
    """Write the tree as ``out`` (a tar.gz with one top folder ``llama.cpp/``) to carry elsewhere.

    Args:
        src: The source to pack.
        out: The archive to write; written to a temporary name first, then renamed.
        trim: Keep only what building llama-bench / test-backend-ops / llama-quantize with the
            CPU, CUDA or HIP backend needs (about a tenth of the tree).

    Returns:
        ``out``.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    root = src.root

    def tar_filter(ti: tarfile.TarInfo) -> tarfile.TarInfo:
        ti.uid = ti.gid = 0
        ti.uname = ti.gname = ""
        return ti

    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with tarfile.open(tmp, "w:gz", compresslevel=6) as tar:
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames.sort()
                rel_dir = Path(dirpath).relative_to(root).as_posix()
                rel_dir = "" if rel_dir == "." else rel_dir + "/"
                if trim:
                    dirnames[:] = [d for d in dirnames if _pack_keep(rel_dir + d, True)]
                else:
                    dirnames[:] = [d for d in dirnames if d != ".git"]
                for f in sorted(filenames):
                    rel = rel_dir + f
                    if trim and not _pack_keep(rel, False):
                        continue
                    full = Path(dirpath) / f
                    if full.is_symlink() or not full.is_file():
                        continue
                    tar.add(full, arcname=f"llama.cpp/{rel}", recursive=False, filter=tar_filter)
            # Identity travels with the tree, so `unpack_source` on another machine registers it
            # under the same SPEC and content id (a study's numbers stay tied to the pinned source).
            meta = {**src.meta, "spec": src.spec, "source_id": src.source_id, "commit": src.commit,
                    "era": src.era, "trimmed": trim}
            blob = json.dumps(meta, indent=2, sort_keys=True).encode()
            info = tarfile.TarInfo("source.json")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def unpack_source(archive: Path) -> Source:
    """Register a tree written by :func:`pack_source` in this machine's cache.

    Afterwards ``fetch_source(<the packed SPEC>)`` finds it without any network access (used to
    carry the pinned source to a GPU machine that cannot reach PyPI).

    Raises:
        UsageError: ``archive`` is missing or was not written by ``tuner source pack``.
    """
    archive = Path(archive)
    if not archive.is_file():
        raise UsageError(f"{archive} does not exist. Write one with `tuner source pack SPEC -o FILE`.")
    staging = _staging()
    try:
        with tarfile.open(archive, "r:gz") as tar:
            names = tar.getnames()
            if "source.json" not in names or not any(n.startswith("llama.cpp/") for n in names):
                raise UsageError(
                    f"{archive} is not a tuner source pack (no source.json + llama.cpp/). "
                    "Write one with `tuner source pack SPEC -o FILE`."
                )
            for m in tar.getmembers():
                if m.name != "source.json" and not m.name.startswith("llama.cpp/"):
                    continue
                if m.issym() or m.islnk() or ".." in Path(m.name).parts:
                    continue
                tar.extract(m, staging, filter="data") if hasattr(tarfile, "data_filter") else tar.extract(m, staging)
        meta = json.loads((staging / "source.json").read_text())
        spec, sid = meta["spec"], meta["source_id"]
        if (_sources_dir() / sid / "llama.cpp" / "CMakeLists.txt").is_file():
            shutil.rmtree(staging, ignore_errors=True)
            src = _load_cached(sid, spec)
            assert src is not None
        else:
            meta.pop("fetched_at", None)
            src = _commit_entry(staging, sid, spec, {k: v for k, v in meta.items() if k not in ("spec", "source_id", "era")})
        _write_json(_index_file(spec), {"spec": spec, "source_id": sid})
        return src
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
