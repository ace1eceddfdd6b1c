"""One ``tuner search`` per run dir and per study: lock files that name their owner.

:func:`run_dir_lock` holds an exclusive ``fcntl.flock`` on ``<run dir>/search.lock`` for the search's life, with
the owner written into it; the kernel drops a flock however its process dies, so a killed search's lock is taken
over, never mistaken for a live one. :func:`study_lock` stops two searches on one study from different run dirs:
for SQLite a flock on a file beside the database; for PostgreSQL (meant for several hosts) a session advisory
lock keyed by a hash of the study name, whose connection's ``application_name`` names the owner. ``tuner
worker`` takes no lock (workers share a study).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import socket
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tuner import log
from tuner.builder.records import describe_owner, owner_record, pid_alive
from tuner.errors import TunerError
from tuner.redact import redact, redact_value
from tuner.study.storage import make_storage

LOCK_NAME = "search.lock"


class RunDirBusy(TunerError):
    """Another live ``tuner search`` holds the run dir's lock."""


class StudyBusy(TunerError):
    """Another live ``tuner search`` holds the study's lock (from another run dir, or another host)."""


def _read_json(path: Path) -> dict[str, Any]:  # JSON as read: checked where used
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def read_owner(run_dir: Path) -> dict[str, object]:
    """What the lock file says about its last owner ({} when absent or unreadable)."""
    return _read_json(Path(run_dir) / LOCK_NAME)


def _busy(run_dir: Path) -> RunDirBusy:
    owner = read_owner(run_dir)
    return RunDirBusy(
        f"another `tuner search` is running on the run dir {run_dir} ({describe_owner(owner) if owner else 'owner unknown'}). "
        "Two searches on one run dir would measure every round twice and export into one folder. Wait for it "
        f"to finish, or stop it (kill {owner.get('pid', 'PID')} on {owner.get('host', 'its host')}) and rerun this "
        "command to resume its study; to run a separate search beside it, pass another --run-dir and --study. "
        "To add tune trials to the same study from here, use `tuner worker`."
    )


def _study_busy(storage_url: str, study: str, holder: str, pid: object, host: object) -> StudyBusy:
    return StudyBusy(
        f"another `tuner search` is running the study {study!r} in {redact(storage_url)} ({holder}), from "
        "another run dir or host. Two searches on one study would both measure its rounds and add tune trials "
        f"beyond --trials. Wait for it to finish, or stop it (kill {pid} on {host}) and rerun to resume the study; "
        "to add tune trials to that study from here, use `tuner worker`; for a search of its own, pass another "
        "--study."
    )


@contextlib.contextmanager
def _owned_flock(
    path: Path, argv: Sequence[str] | None, busy: Callable[[], TunerError], what: str, name: str
) -> Iterator[dict[str, object]]:
    """An exclusive flock on ``path`` for the block, its owner record written into the file; ``busy()`` is
    raised when a live process holds it. A file system without locks warns that ``what`` is not prevented."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):  # e.g. an NFS mount without locking
                log.warning(
                    f"the file system of {path.parent} does not support file locks ({err.strerror}): {what} is "
                    "not prevented; run one at a time."
                )
            elif err.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise
            else:
                raise busy() from None
        old = _read_json(path)
        host = socket.gethostname()
        if old.get("pid") and old.get("pid") != os.getpid():  # a search that ended without its cleanup
            gone = (
                "no longer exists"
                if old.get("host") == host and not pid_alive(int(old["pid"]))
                else "no longer holds it"
            )
            log.notice(
                f"took over {name} ({path}) from a search that stopped without releasing it "
                f"({describe_owner(old)}; that process {gone})."
            )
        me = owner_record(argv)
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


@contextlib.contextmanager
def run_dir_lock(run_dir: Path, argv: Sequence[str] | None = None) -> Iterator[dict[str, object]]:
    """Hold the run dir's lock for the block; yields the owner record. RunDirBusy where a live process holds it."""
    run_dir = Path(run_dir)
    with _owned_flock(
        run_dir / LOCK_NAME, argv, lambda: _busy(run_dir), "a second search on this run dir", "the run dir's lock"
    ) as me:
        yield me


def _study_key(study: str) -> str:
    return hashlib.sha256(b"tuner search\0" + study.encode()).hexdigest()[:16]


def study_lock_path(storage_url: str, study: str) -> Path:
    # sqlite:////abs/x.db and sqlite:///rel.db (check_storage_url has refused in-memory and bad forms)
    db = Path(os.path.realpath(storage_url.partition("?")[0].split("://", 1)[1][1:]))
    return db.with_name(f"{db.name}.study-{_study_key(study)}.lock")


@contextlib.contextmanager
def study_lock(storage_url: str, study: str, argv: Sequence[str] | None = None) -> Iterator[None]:
    """Hold the lock of ``study`` in ``storage_url`` for the block. StudyBusy where a live search holds it."""
    dialect = storage_url.split("://", 1)[0].split("+", 1)[0].lower()
    if dialect == "sqlite":
        path = study_lock_path(storage_url, study)

        def busy() -> StudyBusy:
            owner = _read_json(path)
            holder = describe_owner(owner) if owner else "owner unknown"
            return _study_busy(storage_url, study, holder, owner.get("pid", "PID"), owner.get("host", "its host"))

        with _owned_flock(path, argv, busy, "a second search on this study", "the study's lock"):
            yield
    elif dialect in ("postgresql", "postgres"):
        with _pg_study_lock(storage_url, study):
            yield
    else:
        log.warning(
            f"{redact_value(storage_url)}: tuner cannot lock a study in a {dialect} database, so a second "
            f"`tuner search` on the study {study!r} is not prevented; run one at a time."
        )
        yield


@contextlib.contextmanager
def _pg_study_lock(storage_url: str, study: str) -> Iterator[None]:
    key = int.from_bytes(bytes.fromhex(_study_key(study)), "big", signed=True)
    hi, lo = (key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF  # how pg_locks shows a bigint key
    host = re.sub(r"[^A-Za-z0-9._-]", "", socket.gethostname())
    # application_name is how the refused search learns who holds the lock (at most 63 bytes kept)
    name = f"tuner search PID {os.getpid()} on {host}"[:63]
    engine = make_storage(storage_url).engine
    conn = engine.connect()
    try:
        # Only integers and the sanitized name are written into the SQL: no driver's paramstyle needed.
        conn.exec_driver_sql(f"SELECT set_config('application_name', '{name}', false)")
        got = conn.exec_driver_sql(f"SELECT pg_try_advisory_lock({key})").scalar()
        row = (
            None
            if got
            else conn.exec_driver_sql(
                "SELECT a.application_name, a.backend_start, a.client_addr FROM pg_locks l "
                "JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
                "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                f"AND l.classid::bigint = {hi} AND l.objid::bigint = {lo} AND l.objsubid = 1"
            ).first()
        )
        conn.commit()  # the lock is the session's; no transaction stays open for the search's hours
        if not got:
            app, since, addr = row if row is not None else ("", None, None)
            m = re.fullmatch(r"tuner search PID (\d+) on (\S+)", str(app or ""))
            holder = (
                f"PID {m[1]} on host {m[2]}, connected since {since}" + (f" from {addr}" if addr else "")
                if m
                else "owner unknown"
            )
            raise _study_busy(storage_url, study, holder, m[1] if m else "PID", m[2] if m else "its host")
        try:
            yield
        finally:
            with contextlib.suppress(Exception):  # a lost server dropped the lock with the session
                conn.exec_driver_sql(f"SELECT pg_advisory_unlock({key})")
                conn.commit()
    finally:
        with contextlib.suppress(Exception):
            conn.close()
            engine.dispose()  # the storage's other pooled connections too
