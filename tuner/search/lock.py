"""One ``tuner search`` per run dir: a lock file that names its owner.

Two searches on one run dir would both measure every screen round and store it twice, count each
other's running trial as done and export into one folder. :func:`run_dir_lock` holds an exclusive
``fcntl.flock`` on ``<run dir>/search.lock`` for the life of the search and writes the owner (PID,
host, start time, command, passwords redacted) into it. The kernel drops a flock when its process
dies, however it dies, so a lock left by a killed search is never mistaken for a live one: the next
search takes it over and says so. ``tuner worker`` does not take the lock (workers share a study on
purpose; each trial is its own).
"""

from __future__ import annotations

__all__ = ["LOCK_NAME", "RunDirBusy", "pid_alive", "read_owner", "run_dir_lock"]

import contextlib
import datetime
import errno
import json
import os
import shlex
import socket
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tuner import log
from tuner.errors import TunerError
from tuner.redact import redact_argv

LOCK_NAME = "search.lock"


class RunDirBusy(TunerError):
    """Another live ``tuner search`` holds the run dir's lock."""


def pid_alive(pid: int) -> bool:
    """True when a process ``pid`` exists on this host (signal 0; EPERM means it exists, as another user)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except OSError as err:
        return err.errno == errno.EPERM
    return True


def read_owner(run_dir: Path) -> dict[str, Any]:
    """What the lock file says about its last owner ({} when absent or unreadable)."""
    try:
        data = json.loads((Path(run_dir) / LOCK_NAME).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _describe(owner: Mapping[str, Any]) -> str:
    return f"PID {owner.get('pid', '?')} on host {owner.get('host', '?')}, started {owner.get('started', '?')}" + (
        f": `{owner['command']}`" if owner.get("command") else ""
    )


def _busy(run_dir: Path) -> RunDirBusy:
    """The refusal for a run dir whose lock a live process holds, naming that process and what to do."""
    owner = read_owner(run_dir)
    return RunDirBusy(
        f"another `tuner search` is running on the run dir {run_dir} ({_describe(owner) if owner else 'owner unknown'}). "
        "Two searches on one run dir would measure every round twice and export into one folder. Wait for it "
        f"to finish, or stop it (kill {owner.get('pid', 'PID')} on {owner.get('host', 'its host')}) and rerun this "
        "command to resume its study; to run a separate search beside it, pass another --run-dir and --study. "
        "To add tune trials to the same study from here, use `tuner worker`."
    )


@contextlib.contextmanager
def run_dir_lock(run_dir: Path, argv: Sequence[str] | None = None) -> Iterator[dict[str, Any]]:
    """Hold the run dir's lock for the block; yields the owner record written into it.

    Raises:
        RunDirBusy: another live process holds it (the message names it and what to do).
    """
    import fcntl

    run_dir = Path(run_dir)
    path = run_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):  # e.g. an NFS mount without locking
                log.warning(
                    f"the file system of {run_dir} does not support file locks ({err.strerror}): a second "
                    "search on this run dir is not prevented; run one at a time."
                )
            elif err.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise
            else:
                raise _busy(run_dir) from None
        old = read_owner(run_dir)
        host = socket.gethostname()
        if old.get("pid") and old.get("pid") != os.getpid():  # a search that ended without its cleanup
            gone = (
                "no longer exists"
                if old.get("host") == host and not pid_alive(int(old["pid"]))
                else "no longer holds it"
            )
            log.notice(
                f"took over the run dir's lock from a search that stopped without releasing it "
                f"({_describe(old)}; that process {gone})."
            )
        me = {
            "pid": os.getpid(),
            "host": host,
            "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": shlex.join(["tuner", *redact_argv(sys.argv[1:] if argv is None else argv)]),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        os.fsync(fd)
        try:
            yield me
        finally:
            # An orderly end empties the record, so the next search has nothing to take over.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # closing the last descriptor releases the flock
