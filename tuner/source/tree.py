"""Identify a llama.cpp tree: its era, its upstream commit, the CMake options it declares and the
FlashAttention kernels and config tables it has."""

from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tuner._run import run
from tuner.errors import TunerError, UsageError
from tuner.source.spec import DEFAULT_SPEC, Source

ERAS = ("mma", "rocwmma")
_CUDA_DIR = "ggml/src/ggml-cuda"
_WMMA_FILES = ("fattn-wmma-f16.cu", "fattn-wmma-f16.cuh")
_MMA_FILE = "fattn-mma-f16.cuh"
_ROCWMMA_OPTION = "GGML_HIP_ROCWMMA_FATTN"
_COMMIT_RE = re.compile(r"llama\.cpp@([0-9a-fA-F]{7,40})\b")


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


# --------------------------------------------------------------------------- Era and commit


def find_era(root: Path) -> str:
    """``rocwmma`` or ``mma``, from the FlashAttention files and CMake options the tree has (UsageError for
    neither layout)."""
    cuda = root / _CUDA_DIR
    has_wmma = any((cuda / f).is_file() for f in _WMMA_FILES)
    if has_wmma and _ROCWMMA_OPTION in load_cmake_options(root):
        return "rocwmma"
    if not has_wmma and (cuda / _MMA_FILE).is_file():
        return "mma"
    found = "fattn-wmma-f16 without the option" if has_wmma else "neither kernel file"
    raise UsageError(
        f"The llama.cpp tree at {root} is not supported: looked for {_CUDA_DIR}/{_WMMA_FILES[0]}(h) with the CMake "
        f"option {_ROCWMMA_OPTION} (era 'rocwmma') or {_CUDA_DIR}/{_MMA_FILE} without rocWMMA (era 'mma'), and found "
        f"{found}. Use a llama.cpp from 2025-06 or later (e.g. {DEFAULT_SPEC!r} or 'pypi:llama-cpp-python==0.3.16')."
    )


def find_commit(root: Path, *, changelog: str | None = None) -> str | None:
    """The upstream llama.cpp commit of a tree, or None.

    Tries, in order: the CHANGELOG text of an sdist (its newest release section names
    ``llama.cpp@<hash>``), ``git rev-parse HEAD`` when ``root`` is itself a git work tree, and the
    CHANGELOG of a llama-cpp-python sdist or checkout that ``root`` is the ``vendor/llama.cpp`` of.
    """
    if changelog is not None:
        return _commit_from_changelog(changelog)
    if head := git_head(root):
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


def git_output(root: Path, *args: str) -> str | None:
    """Output of a git command in ``root``, or None when git or the repository is absent."""
    try:
        res = run(["git", "-C", str(root), *args], check=False, what="git", timeout=60)
    except TunerError:  # git not installed
        return None
    return res.output if res.returncode == 0 else None


def git_head(root: Path) -> str | None:
    """The commit checked out at ``root`` when ``root`` is the top of a git work tree, else None."""
    top = git_output(root, "rev-parse", "--show-toplevel")
    # Only when root *is* the work tree: vendor/llama.cpp inside a llama-cpp-python checkout has
    # the wrapper's HEAD, which is not a llama.cpp commit.
    if not top or Path(top.strip()).resolve() != root.resolve():
        return None
    head = git_output(root, "rev-parse", "HEAD")
    return head.strip() if head else None


# --------------------------------------------------------------------------- CMake options

_BRACKET_COMMENT = re.compile(r"#\[(=*)\[.*?\]\1\]", re.DOTALL)
_CACHE_TYPES = ("BOOL", "STRING", "PATH", "FILEPATH")
# What a tuner build is: llama.cpp is the top-level project and ggml a subdirectory of it.
_STANDALONE_FACTS = {"LLAMA_STANDALONE": "ON", "GGML_STANDALONE": "OFF"}


def parse_cmake_commands(text: str) -> Iterator[tuple[str, list[str], int, int]]:
    """Yield ``(command, args, line, if_depth)`` for each CMake command call in ``text``.

    A small tokenizer, enough for option()/set(): handles comments, quoted arguments with escapes, nested parentheses
    and calls spread over several lines. ``if_depth`` counts the enclosing ``if()`` blocks.
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
        elif c == ")" and level == 0:
            if have:
                args.append("".join(cur))
            return args, i + 1, line
        else:  # a nested ")" is kept as text but does not by itself start an argument
            level += {"(": 1, ")": -1}.get(c, 0)
            cur.append(c)
            have = have or c != ")"
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

    Scans the top-level CMakeLists.txt, ggml/CMakeLists.txt, ggml/cmake/*.cmake and every CMakeLists.txt / *.cmake under
    ggml/src (not vendored code). The first declaration of a name wins (the top-level one is what a llama.cpp build
    sees); a name declared again with another default (if/else branches) gets ``resolved=None``. ``FORCE``d and
    ``INTERNAL`` cache entries are overrides, not declarations, and are skipped.

    ``resolved`` substitutes ``${VAR}`` when VAR is another declared option, a variable every plain ``set(VAR value)``
    in these files gives the same literal, or LLAMA_STANDALONE (ON) / GGML_STANDALONE (OFF) -- llama.cpp is always the
    top-level project in a tuner build. Otherwise it is None.
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
                name=name,
                default=default,
                resolved=None,
                help=help_,
                kind=kind,
                file=rel,
                line=line,
                conditional=depth > 0,
            )
    facts = {k: next(iter(v)) for k, v in plain.items() if len(v) == 1} | _STANDALONE_FACTS
    resolved: dict[str, str | None] = {}

    def resolve(name: str, seen: frozenset[str]) -> str | None:
        if name in resolved or name in ambiguous:
            return resolved.get(name)
        out = found[name].default
        for var in re.findall(r"\$\{([A-Za-z0-9_]+)\}", out):
            val = resolve(var, seen | {var}) if var in found and var not in seen else facts.get(var)
            if val is None or "${" in val:
                resolved[name] = None
                return None
            out = out.replace("${" + var + "}", val)
        resolved[name] = out
        return out

    return {n: dataclasses.replace(o, resolved=resolve(n, frozenset({n}))) for n, o in found.items()}


# --------------------------------------------------------------------------- Describing a tree

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
    prefixes = {"VEC": "fattn-vec", "TILE": "fattn-tile", "MMA": "fattn-mma-f16", "WMMA": "fattn-wmma-f16"}
    kernels = {k: any(n.startswith(prefix) for n in names) for k, prefix in prefixes.items()}
    tables: dict[str, object] = {}
    mma_text = _read(cuda / _MMA_FILE)
    tile = _table_rows(_read(cuda / "fattn-tile.cuh"), _TILE_TABLE_RE, "GGML_CUDA_FATTN_TILE_CONFIG_CASE")
    mma = _table_rows(mma_text, _MMA_TABLE_RE, "GGML_CUDA_FATTN_MMA_CONFIG_CASE")
    if tile:
        tables["tile"] = {"file": f"{_CUDA_DIR}/fattn-tile.cuh", "rows": tile}
    if mma:
        tables["mma"] = {"file": f"{_CUDA_DIR}/{_MMA_FILE}", "rows": mma}
    if specs := [f"{a}x{b}" for a, b in _B_MMA_SPEC_RE.findall(mma_text)]:
        tables["mma_f16_config"] = {"file": f"{_CUDA_DIR}/{_MMA_FILE}", "specializations": specs}
    if wmma := [f"{_CUDA_DIR}/{f}" for f in _WMMA_FILES if (cuda / f).is_file()]:
        tables["wmma"] = {"files": wmma}
    fams = (re.sub(r"-instance.*$", "", p.stem) for p in sorted((cuda / "template-instances").glob("fattn-*.cu")))
    instances = dict(collections.Counter(fams))
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
        # every field but the name, in the dataclass's order
        "options": {
            n: {k: v for k, v in dataclasses.asdict(o).items() if k != "name"} for n, o in sorted(opts.items())
        },
    }
