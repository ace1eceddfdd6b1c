"""Build records, build locks and artifact folders: ``build.json`` files, the cache lookup, and the
versions of an artifact that running commands hold.

An artifact ``artifacts/<artifact_key>`` is a symbolic link to its current folder ``artifacts/<artifact_key>.v<N>``. A
build that changes it (more targets, another toolchain) installs a new folder and moves the link with one
``os.replace``; it never writes over a folder in use. A command that uses a build holds a shared ``flock`` on its
folder's ``.users`` file for the rest of its life (:func:`hold_artifact`), so an older folder is removed only once no
process holds it (the kernel drops the lock of a process however it ends). A running search therefore keeps the binaries
it started with while ``tuner build`` adds ``llama-perplexity`` to the same variant.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import shlex
import shutil
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from tuner import log
from tuner.redact import redact_argv
from tuner.targets.host import host_isa

_T = TypeVar("_T")

WAIT_NOTE_S = 30.0
"""How often a command waiting on another's build lock says it is still waiting (seconds)."""

_USERS = ".users"
_held: dict[str, int] = {}  # version folder -> descriptor holding its shared lock, for the process's life


def load_build_record(path: Path) -> dict[str, Any] | None:
    """A ``build.json`` (a build directory's latest attempt, or an artifact's record); None if absent."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_json(path: Path, data: Mapping[str, object]) -> None:
    """Write ``data`` as JSON atomically (temporary file, then rename)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    tmp.replace(path)


def pid_alive(pid: int) -> bool:
    """True when a process ``pid`` exists on this host (signal 0; EPERM means it exists, as another user)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except OSError as err:
        return err.errno == errno.EPERM
    return True


def owner_record(argv: Sequence[str] | None = None) -> dict[str, object]:
    """What a lock file says about the process holding it: PID, host, start time, command (passwords redacted)."""
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": shlex.join(["tuner", *redact_argv(sys.argv[1:] if argv is None else argv)]),
    }


def describe_owner(owner: Mapping[str, object]) -> str:
    """``PID 12 on host h, started T: `tuner ...``` for an :func:`owner_record`."""
    return f"PID {owner.get('pid', '?')} on host {owner.get('host', '?')}, started {owner.get('started', '?')}" + (
        f": `{owner['command']}`" if owner.get("command") else ""
    )


def _holder(fd: int) -> str:
    try:
        owner = json.loads(os.pread(fd, 1 << 16, 0) or b"{}")
    except (OSError, ValueError):
        owner = None
    if isinstance(owner, dict) and owner:
        pid = owner.get("pid")
        # a record left by a process that died: whoever holds the lock now did not say
        if not (owner.get("host") == socket.gethostname() and isinstance(pid, int) and not pid_alive(pid)):
            return describe_owner(owner)
    return "a process that does not say which (an older tuner?)"


def _try_exclusive(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _wait_exclusive(fd: int, what: str) -> None:
    """Take ``fd``'s exclusive flock; while another holds it, say so at once and every WAIT_NOTE_S."""
    if _try_exclusive(fd):
        return
    start = time.monotonic()
    log.notice(
        f"waiting for {what}: {_holder(fd)} holds it (another command building the same variant). "
        "This command goes on when that one is done."
    )
    say = start + WAIT_NOTE_S
    while not _try_exclusive(fd):
        now = time.monotonic()
        if now >= say:
            log.notice(f"still waiting for {what} ({now - start:.0f} s so far; held by {_holder(fd)}).")
            say = now + WAIT_NOTE_S
        time.sleep(min(0.2, WAIT_NOTE_S / 4))
    log.notice(f"got {what} after {time.monotonic() - start:.0f} s.")


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
    """Hold the key directory's exclusive lock (``root/.lock``) for the block.

    The lock file names its holder (:func:`owner_record`), and a command that has to wait for it says
    who holds it and, at intervals, how long it has waited.
    """
    # Parallel search workers may build candidates of one key; they share build/ and must take turns.
    root.mkdir(parents=True, exist_ok=True)
    # Not O_TRUNC: opening the file must not erase the holder's record that the waiter is about to read.
    fd = os.open(root / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        _wait_exclusive(fd, f"the build lock of {root}")
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(owner_record()) + "\n").encode(), 0)
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def current_artifact(art: Path) -> Path | None:
    """The folder the artifact link ``art`` points at; ``art`` itself for a real folder (the layout of an
    older tuner); None when there is neither."""
    try:
        target = os.readlink(art)
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno == errno.EINVAL:  # not a link
            return art if art.is_dir() else None
        raise
    # tuner writes a sibling's plain name; anything else is not its link
    return None if "/" in target or target in ("", ".", "..") else art.parent / target


def _hold(folder: Path) -> bool:
    """Take (once per process) a shared lock on ``folder``'s ``.users``; False when the folder is going."""
    if str(folder) in _held:
        return True
    try:
        fd = os.open(folder / _USERS, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while prune_artifacts deletes this folder
        st = os.fstat(fd)
        if st.st_nlink == 0 or os.stat(folder / _USERS).st_ino != st.st_ino:
            raise FileNotFoundError(folder)  # deleted while we waited
    except OSError:
        os.close(fd)
        return False
    _held[str(folder)] = fd
    return True


def hold_artifact(art: Path, accept: Callable[[Path], _T | None]) -> tuple[Path, _T] | None:
    """The artifact's current folder and ``accept(folder)``, with the folder held for this process's life.

    None when there is no current folder in the versioned layout, or ``accept`` returns None (e.g. the
    build lacks a target); nothing is held then.
    """
    for _ in range(20):  # a folder replaced between reading the link and locking: read it again
        cur = current_artifact(art)
        if cur is None or cur == art:
            return None
        got = accept(cur)
        if got is None:
            return None
        if _hold(cur):
            return cur, got
    return None


def _install(folder: Path, art: Path) -> Path:
    """Rename ``folder`` to the artifact's next version ``<art>.v<N>`` and move the link ``art`` to it in one rename
    (a reader sees the old folder or the new one); returns the new folder."""
    (folder / _USERS).touch()
    nums = [int(tail) for d in art.parent.glob(art.name + ".v*") if (tail := d.name[len(art.name) + 2 :]).isdigit()]
    dest = art.with_name(f"{art.name}.v{max(nums, default=0) + 1}")
    folder.rename(dest)
    tmp = art.with_name(f".{art.name}.link-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    os.symlink(dest.name, tmp)
    os.replace(tmp, art)
    return dest


def adopt_old_layout(art: Path) -> None:
    """Turn a real artifact folder of an older tuner into the versioned layout (caller holds the build lock)."""
    if art.is_symlink() or not art.is_dir():
        return
    _install(art, art)


def install_artifact(staging: Path, art: Path) -> Path:
    """Install the complete folder ``staging`` as the artifact ``art``'s new current folder; returns it.

    The caller holds the key's build lock. The folder the link pointed at before stays for whoever runs
    from it; folders no process holds any more are removed (:func:`prune_artifacts`).
    """
    art.parent.mkdir(parents=True, exist_ok=True)
    adopt_old_layout(art)
    dest = _install(staging, art)
    prune_artifacts(art)
    return dest


def prune_artifacts(art: Path) -> None:
    """Remove the artifact's old folders that no process holds."""
    cur = current_artifact(art)
    for d in sorted(art.parent.glob(art.name + ".v*")):
        if (cur is not None and d.name == cur.name) or d.is_symlink() or not d.is_dir():
            continue
        try:
            fd = os.open(d / _USERS, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:  # half removed before: no one can hold it
            shutil.rmtree(d, ignore_errors=True)
            continue
        try:
            if not _try_exclusive(fd):
                continue  # a running command uses it
            # .users first: a folder without it is never taken, even if the rest cannot be removed
            (d / _USERS).unlink(missing_ok=True)
            shutil.rmtree(d, ignore_errors=True)
        finally:
            os.close(fd)


def is_on(value: object) -> bool:
    """A CMake boolean define's truth (``ON``, ``1``, ``TRUE``...; anything else, None included, is off)."""
    return str(value).upper() in {"ON", "1", "TRUE", "YES", "Y"}


def native_isa(defines: Mapping[str, object]) -> str | None:
    """This CPU's :func:`tuner.targets.host.host_isa` when ``defines`` make a ``GGML_NATIVE`` build (llama.cpp's
    default), else None: such a build's binaries hold this CPU's instructions and run on no other."""
    native = defines.get("GGML_NATIVE")
    return host_isa() if native is None or is_on(native) else None


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
    return rec if all((art / "bin" / t).is_file() for t in targets) else None
