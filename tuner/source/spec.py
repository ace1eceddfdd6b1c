"""What a SPEC names and what a fetched tree is: ``SourceSpec``, ``Source`` and SPEC parsing.

A SPEC names where the tree comes from:

- ``pypi:llama-cpp-python==X`` -- the llama-cpp-python sdist, whose ``vendor/llama.cpp`` is the
  tree (downloaded with pip, so pip's index configuration, proxy and cache apply);
- ``git:URL@REF`` -- a clone of URL checked out at REF;
- ``path:DIR`` -- a local llama.cpp checkout, used in place.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from tuner.errors import UsageError, close_matches

DEFAULT_SPEC = "pypi:llama-cpp-python==0.3.36"
_SCHEMES = ("pypi", "git", "path")
PYPI_NAME = "llama-cpp-python"
_VERSION_RE = re.compile(r"[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?")
_BAD_GIT_CHAR = re.compile(r"[\s\x00-\x1f\x7f]")


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
            return f"pypi:{PYPI_NAME}=={self.value}"
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


# --------------------------------------------------------------------------- SPEC parsing


def parse_spec(spec: str | None = None) -> SourceSpec:
    """Parse a SPEC string (the forms: module docstring); UsageError for an unknown scheme, an unpinned or
    malformed pypi requirement, another package, a git spec without ``@REF``, or a path that is missing or
    not a llama.cpp tree."""
    spec = (spec or DEFAULT_SPEC).strip()
    scheme, sep, rest = spec.partition(":")
    if not sep or scheme not in _SCHEMES:
        hint = close_matches(scheme, _SCHEMES) if sep else ""
        raise UsageError(
            f"SPEC {spec!r} has no known scheme.{hint} Use one of 'pypi:{PYPI_NAME}==VERSION' (e.g. {DEFAULT_SPEC!r}), "
            "'git:URL@REF' (e.g. 'git:https://github.com/ggml-org/llama.cpp@b6129') or 'path:DIR' (a local llama.cpp "
            "checkout)."
        )
    if scheme == "pypi":
        return _parse_pypi(spec, rest)
    if scheme == "git":
        url, at, ref = rest.rpartition("@")
        # "git@host:repo" has an '@' in the URL itself; the REF is after the last '@' and
        # never contains ':' or '/'-less host parts, so require a non-empty URL and REF.
        if not at or not url or not ref or ":" in ref:
            raise UsageError(
                f"SPEC {spec!r} does not name a revision. Write 'git:URL@REF' with a branch, tag or commit after the "
                "last '@', e.g. 'git:https://github.com/ggml-org/llama.cpp@b6129'."
            )
        if url.startswith("-") or ref.startswith("-"):
            raise UsageError(f"SPEC {spec!r}: a git URL or REF may not start with '-' (it would read as a git option).")
        if _BAD_GIT_CHAR.search(rest):
            # Both go to git as arguments: a NUL cannot be passed at all, and no URL or ref
            # (git check-ref-format) holds a space or control character.
            raise UsageError(
                f"SPEC {spec!r}: the git URL or REF holds a space or control character. Write "
                "'git:URL@REF' with neither, e.g. 'git:https://github.com/ggml-org/llama.cpp@b6129'."
            )
        return SourceSpec(scheme="git", value=url, ref=ref)
    return SourceSpec(scheme="path", value=str(_parse_path(spec, rest)))


def _parse_path(spec: str, rest: str) -> Path:
    missing = (
        f"SPEC {spec!r}: directory {rest!r} does not exist. Give the path of a llama.cpp "
        "checkout (the folder holding CMakeLists.txt and ggml/), e.g. 'path:~/src/llama.cpp'."
    )
    try:
        # expanduser raises RuntimeError for '~user' with no such user; stat raises OSError
        # for a name too long or a folder we may not enter.
        path = Path(rest).expanduser()
        if not rest or not path.is_dir():
            raise UsageError(missing)
        path = path.resolve()
    except (RuntimeError, OSError, ValueError) as err:
        raise UsageError(f"{missing} ({err})") from err
    if str(path) != str(path).strip():
        # A SPEC is stripped when parsed, so its normalized form could not name this folder again.
        raise UsageError(
            f"SPEC {spec!r}: directory {str(path)!r} ends in whitespace, which a SPEC cannot carry. "
            "Rename the folder or point at it through a link without the trailing space."
        )
    require_tree(path, spec)
    return path


def _parse_pypi(spec: str, req: str) -> SourceSpec:
    name, eq, version = req.partition("==")
    name, version = name.strip(), version.strip()
    bad_op = re.search(r"(>=|<=|~=|!=|===|>|<)", req)
    if not eq or bad_op or not name:
        raise UsageError(
            f"SPEC {spec!r} is not pinned. Only exact pins are allowed, because the tree must not change under a "
            f"cached id: write 'pypi:{PYPI_NAME}==VERSION', e.g. {DEFAULT_SPEC!r}."
        )
    if re.sub(r"[-_.]+", "-", name).lower() != PYPI_NAME:
        raise UsageError(
            f"SPEC {spec!r} names package {name!r}; only {PYPI_NAME!r} vendors llama.cpp in its sdist. Write "
            f"'pypi:{PYPI_NAME}==VERSION', or use 'git:URL@REF' / 'path:DIR' for other trees."
        )
    if not _VERSION_RE.fullmatch(version):
        raise UsageError(
            f"SPEC {spec!r}: {version!r} is not a release version. Write a version such as "
            "'0.3.36' (see https://pypi.org/project/llama-cpp-python/#history)."
        )
    return SourceSpec(scheme="pypi", value=version)


def require_tree(root: Path, spec: str) -> None:
    """UsageError unless ``root`` looks like a llama.cpp tree (its CMakeLists.txt and ggml/CMakeLists.txt)."""
    try:
        missing = [p for p in ("CMakeLists.txt", "ggml/CMakeLists.txt") if not (root / p).is_file()]
    except OSError as err:  # unreadable folder
        missing = [f"CMakeLists.txt ({err})"]
    if missing:
        raise UsageError(
            f"SPEC {spec!r}: {root} is not a llama.cpp tree ({' and '.join(missing)} missing). "
            "Point at the top of a llama.cpp checkout, the folder holding CMakeLists.txt and ggml/ "
            "(in a llama-cpp-python checkout that is vendor/llama.cpp)."
        )
