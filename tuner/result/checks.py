"""What the checks of a stored result share (:mod:`tuner.result.validate`, :mod:`tuner.result.upstream_check`,
:mod:`tuner.sweep.table_check`): a check's outcome (:class:`Finding`), reading a result folder as data, and
applying a patch to pristine copies of the files it touches. A result folder arrives from others (a pull
request): only regular files inside it are opened (no link, FIFO or device; at most :data:`MAX_FILE_BYTES`),
and no file a patch names is touched before every such name is a plain relative path inside the tree.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

from tuner import _run
from tuner._compat import tomllib
from tuner.errors import TunerError, UsageError

MAX_FILE_BYTES = 64 * 2**20
"""The largest file a result folder may hold (the stored ones are below 1 MiB)."""
MAX_FOLDER_ENTRIES = 10_000
"""The most files and folders one result folder may hold."""
_LEFTOVER = re.compile(r"^\..+\.(tmp|old)-[A-Za-z0-9_]+$")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Finding:
    """One check of a result: its name, whether it passed, and why (or why it was skipped)."""

    check: str
    ok: bool
    detail: str = ""


class FolderError(TunerError):
    """A file of a result folder that a static check will not read (a link, a FIFO, too large, not UTF-8...)."""


class ArgumentError(UsageError):
    """Bad command-line input met while checking one folder (a ``--from-pack`` of another build): exit 2 for
    the whole command, not a finding of that folder."""


def is_leftover(name: str) -> bool:
    """``name`` is a staging folder of an interrupted export (``.OUT.tmp-*``, ``.OUT.old-*``)."""
    return bool(_LEFTOVER.match(name))


def folder_problems(folder: Path) -> list[str]:
    """Entries under ``folder`` a static check refuses (symbolic links, FIFOs, devices, sockets, files over
    :data:`MAX_FILE_BYTES`), each as ``relative path (why)``; links are listed, never followed."""
    bad: list[str] = []
    count = 0
    stack = [folder]
    while stack:
        d = stack.pop()
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError as err:
            bad.append(f"{d.relative_to(folder).as_posix() or '.'} (unreadable: {err.strerror})")
            continue
        for e in entries:
            count += 1
            if count > MAX_FOLDER_ENTRIES:
                return [*bad, f"more than {MAX_FOLDER_ENTRIES} entries"]
            rel = Path(e.path).relative_to(folder).as_posix()
            st = e.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                bad.append(f"{rel} (a symbolic link to {os.readlink(e.path)!r})")
            elif stat.S_ISDIR(st.st_mode):
                stack.append(Path(e.path))
            elif not stat.S_ISREG(st.st_mode):
                bad.append(f"{rel} (not a regular file: {_kind(st.st_mode)})")
            elif st.st_size > MAX_FILE_BYTES:
                bad.append(f"{rel} ({st.st_size} bytes, over the {MAX_FILE_BYTES // 2**20} MiB limit)")
    return bad


_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "a special file")


def present_in(folder: Path, rel: str) -> bool:
    """Something named ``rel`` is in ``folder`` (of any kind, links not followed)."""
    try:
        os.lstat(folder / rel)
    except OSError:
        return False
    return True


def read_bytes_in(folder: Path, rel: str, *, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of the regular file ``folder/rel``, no larger than ``limit``; FolderError where ``rel`` leaves
    the folder, a part of it is a link, it is not a regular file, or is too large."""
    parts = PurePosixPath(rel).parts
    if not parts or PurePosixPath(rel).is_absolute() or ".." in parts:
        raise FolderError(f"{rel!r} is not a path inside {folder}")
    cur = folder
    for i, part in enumerate(parts):
        cur = cur / part
        try:
            st = os.lstat(cur)
        except OSError as err:
            raise FolderError(f"{cur} cannot be read ({err.strerror})") from err
        if stat.S_ISLNK(st.st_mode):
            raise FolderError(f"{cur} is a symbolic link; a result folder is read without following links")
        if i < len(parts) - 1 and not stat.S_ISDIR(st.st_mode):
            raise FolderError(f"{cur} is not a folder")
    try:  # O_NONBLOCK: a FIFO swapped in after the lstat above does not hang the open
        fd = os.open(cur, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        why = "a symbolic link" if err.errno == errno.ELOOP else err.strerror
        raise FolderError(f"{cur} cannot be read ({why})") from err
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise FolderError(f"{cur} is not a regular file ({_kind(st.st_mode)})")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise FolderError(f"{cur} is larger than the {limit // 2**20} MiB a result file may be")
    return data


def read_text_in(folder: Path, rel: str, *, limit: int = MAX_FILE_BYTES) -> str:
    """:func:`read_bytes_in` as UTF-8 text (``FolderError`` where it is not UTF-8)."""
    data = read_bytes_in(folder, rel, limit=limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise FolderError(f"{folder / rel} is not UTF-8 text ({err.reason} at byte {err.start})") from err


def load_toml_in(folder: Path, rel: str) -> dict[str, Any]:
    """The TOML file ``folder/rel`` (``FolderError`` where it cannot be read or parsed)."""
    text = read_text_in(folder, rel)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise FolderError(f"{folder / rel} is not valid TOML: {err}") from err
    except RecursionError as err:
        raise FolderError(f"{folder / rel} nests tables or arrays too deeply to read") from err


# Every header of a git diff that names a path: ---/+++, diff --git, rename/copy from/to.
_HEADER = re.compile(
    r"^(?:(?:---|\+\+\+) (?P<file>.*)|diff --git (?P<pair>.*)|(?:rename|copy) (?:from|to) (?P<rc>.*))$"
)


def _unquote(p: str) -> str:
    if len(p) >= 2 and p[0] == p[-1] == '"':  # git quotes names with special characters, C-style
        return p[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape", "replace")
    return p


def _path_names(line: str) -> list[tuple[str, bool]]:
    """Paths a header line names, each with whether it carries git's ``a/`` or ``b/`` prefix."""
    m = _HEADER.match(line)
    if m is None:
        return []
    if m["file"] is not None:
        p = _unquote(m["file"].split("\t", 1)[0].rstrip())
        return [] if p == "/dev/null" else [(p, True)]
    if m["pair"] is not None:
        pair = m["pair"]
        q = re.fullmatch(r'("(?:[^"\\]|\\.)*"|\S+) ("(?:[^"\\]|\\.)*"|\S+)', pair)
        names = [q[1], q[2]] if q else pair.split(" ")
        return [(_unquote(n), True) for n in names]
    return [(_unquote(m["rc"]), False)]


def unsafe_patch_paths(text: str) -> list[str]:
    """Paths ``text`` (a diff) names that are not plain relative paths inside the tree (absolute, ``..``,
    without the ``a/``/``b/`` prefix, empty, or with a NUL or backslash), each once."""
    bad: list[str] = []
    for line in text.splitlines():
        for p, prefixed in _path_names(line):
            rel = p
            if prefixed:
                if not p.startswith(("a/", "b/")):
                    bad.append(p)
                    continue
                rel = p[2:]
            parts = PurePosixPath(rel).parts
            if not parts or rel.startswith("/") or ".." in parts or any(c in rel for c in "\\\0") or parts[0] == ".git":
                bad.append(p)
    return list(dict.fromkeys(bad))


def git_apply_to_copy(patch: Path | str, root: Path, *, check: bool = True) -> tuple[_run.RunResult, dict[str, str]]:
    """``git apply`` (``--check`` by default) of ``patch`` (its text, or a result folder's file) against
    pristine copies of the files it touches: the run's result and, when applied (``check=False``, exit 0), each
    touched file's new text. Not in the tree itself: a vendored tree's ``.git`` file may point at a missing
    submodule, and inside a git work tree git applies paths relative to its root ("Skipped patch"). FolderError,
    with nothing copied, where the patch names a path outside the tree."""
    text = patch if isinstance(patch, str) else read_text_in(patch.parent, patch.name)
    if bad := unsafe_patch_paths(text):
        raise FolderError(
            f"the patch names {len(bad)} path(s) that are not plain relative paths inside the tree "
            f"({', '.join(repr(b) for b in bad[:3])}); nothing was copied or applied"
        )
    rels = sorted({p[2:] for ln in text.splitlines() if ln.startswith("--- ") for p, _ in _path_names(ln)})
    with tempfile.TemporaryDirectory(prefix="tuner-apply-") as scratch:
        tree, pfile = Path(scratch) / "tree", Path(scratch) / "patch.diff"
        tree.mkdir()
        pfile.write_text(text)
        for rel in rels:
            src = root / rel
            if src.is_file() and not src.is_symlink():
                (tree / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, tree / rel)
        args = ["git", "apply", *(["--check"] if check else []), "--verbose", str(pfile)]
        res = _run.run(args, cwd=tree, check=False, timeout=120, what="git apply --check" if check else "git apply")
        new = {} if check or res.returncode != 0 else {rel: (tree / rel).read_text() for rel in rels}
        return res, new
