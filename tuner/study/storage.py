"""Where a study lives: the Optuna storage a search writes and an export reads (SQLite in the run
directory by default, or PostgreSQL shared by several hosts), and the check of a ``--storage`` URL."""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from tuner.errors import TunerError, UsageError, error_chain
from tuner.extras import missing_module_error
from tuner.redact import redact, redact_value, remember

if TYPE_CHECKING:
    from optuna.storages import BaseStorage, RDBStorage

logger = logging.getLogger(__name__)

STORAGE_DIALECTS = ("sqlite", "postgresql", "postgres", "mysql", "mariadb")
"""Database dialects an Optuna RDB storage URL may name (``dialect[+driver]://...``)."""

_URL = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*)://(?P<rest>.*)", re.DOTALL)


def check_storage_url(url: str) -> str:
    """``url`` unchanged when it names a database that keeps the study; else a UsageError (exit 2, no password
    in it). Refused: not ``dialect[+driver]://...`` of a known dialect, an in-memory SQLite (a rerun could not
    resume), a SQLite file whose folder does not exist (tuner makes no folders outside the run dir), a bad port."""
    if isinstance(url, str):
        remember(url)  # from here on any text quoting it (an error's message, a traceback) hides its password
    shown = redact_value(str(url))
    fix = (
        "Pass --storage sqlite:///PATH/study.db (an existing folder), postgresql://USER@HOST/DB, or leave "
        "--storage out for a SQLite study in the run dir."
    )
    if isinstance(url, str) and "://" not in url and "=" in url:
        raise UsageError(
            f"--storage {shown!r} is a libpq keyword/value string; Optuna opens a study by URL. Write it as "
            "postgresql://USER@HOST:PORT/DB (a password from PGPASSWORD or ~/.pgpass, or percent-encoded in the URL)."
        )
    if not isinstance(url, str) or not url or url != url.strip() or any(ord(c) < 32 or c.isspace() for c in url):
        raise UsageError(
            f"--storage {shown!r} is not a storage URL (it is empty or holds spaces or control characters). {fix}"
        )
    m = _URL.fullmatch(url)
    if m is None:
        raise UsageError(f"--storage {shown!r} is not a storage URL (DIALECT://...). {fix}")
    dialect = m["scheme"].split("+", 1)[0].lower()
    if dialect not in STORAGE_DIALECTS:
        raise UsageError(
            f"--storage {shown!r}: unknown database {m['scheme']!r}; Optuna's RDB storage takes "
            f"{', '.join(STORAGE_DIALECTS)}. {fix}"
        )
    rest = m["rest"]
    if dialect == "sqlite":
        path, _, query = rest.partition("?")
        if (
            not path.startswith("/")
            or path in ("/", "/:memory:")
            or ":memory:" in path
            or "mode=memory" in query.lower()
        ):
            raise UsageError(
                f"--storage {shown!r} keeps the study in memory: nothing would be saved and a rerun could "
                f"not resume. {fix}"
            )
        db = Path(path[1:])  # sqlite:///rel/x.db is relative, sqlite:////abs/x.db absolute
        if db.is_dir():
            raise UsageError(
                f"--storage {shown!r} names the folder {db}, not a database file. Add a file name, e.g. "
                f"sqlite:///{(db / 'study.db')}."
            )
        if not db.parent.is_dir():
            raise UsageError(
                f"--storage {shown!r}: the folder {db.parent} does not exist, and tuner creates no "
                f"folders outside the run dir unasked. Create it first (mkdir -p {db.parent}) or pick "
                "a path in an existing folder."
            )
        return url
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a non-numeric or out-of-range port
    except ValueError as err:
        raise UsageError(f"--storage {shown!r} does not parse as a URL ({redact(err)}). {fix}") from None
    if not parts.hostname and "host=" not in parts.query:
        raise UsageError(f"--storage {shown!r} names no database host. {fix}")
    return url


def _rdb_storage(url: str, existing: bool) -> RDBStorage:
    import optuna  # heavy: imported when a storage is opened

    with warnings.catch_warnings():
        # Heartbeats and stale-trial retry are experimental in Optuna 5; we rely on them knowingly.
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.RDBStorage(
            url,
            heartbeat_interval=HEARTBEAT_S,
            grace_period=GRACE_S,
            heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=2),
            engine_kwargs=_engine_kwargs(url),
            skip_table_creation=existing,  # a database without a study stays as it was
        )


def _engine_kwargs(url: str) -> dict[str, object] | None:
    if url.startswith("postgresql"):
        return {"pool_pre_ping": True}
    if _is_sqlite(url):
        # a writer waits out readers (a worker, a dashboard, `tuner export`) up to a minute, not sqlite3's 5 s
        # default: on a loaded machine a commit during a trial's cleanup otherwise fails "database is locked"
        return {"connect_args": {"timeout": 60}}
    return None


def make_storage(url: str, *, existing: bool = False) -> RDBStorage:
    """An Optuna RDB storage for ``url`` (:func:`check_storage_url`), with heartbeats so a trial whose process
    died is run again. A wrong password, a server down or a missing database is a UsageError naming the URL
    (password hidden), never a traceback. ``existing`` (export, worker): a missing SQLite file is refused, not
    created (a typo would leave an empty database behind)."""

    check_storage_url(url)
    if existing and _is_sqlite(url):
        db = Path(url.partition("?")[0].split("://", 1)[1][1:])
        if not db.is_file():
            raise UsageError(
                f"no study database at {db} (--storage {redact_value(url)!r}); this command reads a study that "
                "`tuner search` wrote and creates none. Check the path, or pass the search's --run-dir instead."
            )
    try:
        for attempt in range(2):
            try:
                return _rdb_storage(url, existing)
            except Exception as err:
                # Two processes opening a new database at once both create Optuna's tables, and the later
                # one fails on "table ... already exists" (or on the schema version row both insert: "UNIQUE
                # constraint failed: alembic_version"): the tables are there now, so open it again.
                why = str(_root_cause(err))
                if not ("already exists" in why or "alembic_version" in why):
                    raise
                time.sleep(0.2 * (attempt + 1))
        return _rdb_storage(url, existing)  # the third try: any error is the storage's
    except ImportError as err:
        raise missing_module_error(err) or UsageError(
            f"storage {redact_value(url)!r} needs a database driver that is not installed ({err})."
        ) from None
    except Exception as err:  # sqlalchemy OperationalError and friends (Optuna wraps some in StorageInternalError)
        cause = _root_cause(err)
        if existing and "version_info" in str(cause):  # Optuna's schema table: there is no study here
            raise UsageError(
                f"the study storage {redact_value(url)!r} holds no Optuna study (it has no Optuna tables): it is "
                "not a database `tuner search` wrote. Check --storage (or pass the search's --run-dir)."
            ) from None
        raise UsageError(
            f"cannot open the study storage {redact_value(url)!r}: {redact(_first_line(cause))}. Check the URL, that "
            "the server is up and that the database exists (createdb NAME)."
        ) from None


def check_storage(url: str, *, existing: bool = False) -> None:
    """:func:`make_storage`'s check, before a command spends minutes on a fetch, a build or a model: a
    server's storage is opened and closed again (a new SQLite file is left for the search to create, so a
    search refused later leaves none); with ``existing`` the study's database is opened and changed in nothing."""
    if not existing and _is_sqlite(url):
        check_storage_url(url)
        return
    storage = make_storage(url, existing=existing)
    with contextlib.suppress(Exception):
        storage.engine.dispose()


def _is_sqlite(url: str) -> bool:
    return url.split(":", 1)[0].split("+", 1)[0].lower() == "sqlite"


HEARTBEAT_S = 10
"""Seconds between a running tune trial's heartbeats (a thread records them in the storage)."""
GRACE_S = 60
"""A RUNNING trial without a heartbeat for this long belongs to a process that died: it is failed and
re-run (Optuna's fail_stale_trials; a retry copy of it is queued)."""


class StorageLost(TunerError):
    """The study's database went away while a command used it (a PostgreSQL server stopped, the network
    dropped): exit 1, not a bug in tuner."""


_LOST_HINT = (
    "What was measured before is in the study. Once the database is reachable again, rerun the same command: "
    "it resumes, and a tune trial that was running is marked failed and run again."
)


def _lost_storage_error(err: BaseException) -> BaseException | None:
    """The driver-level connection failure in ``err``'s chain (sqlalchemy's OperationalError, InterfaceError
    or DisconnectionError of a database server), or None. SQLite's own errors (a full disk, a locked file)
    are not a lost server: the CLI words those itself."""
    try:
        from sqlalchemy import exc
    except ImportError:
        return None
    for e in error_chain(err):
        if isinstance(e, (exc.OperationalError, exc.InterfaceError, exc.DisconnectionError)):
            orig = getattr(e, "orig", None)
            if not type(orig).__module__.startswith("sqlite3"):
                return e
    return None


@contextlib.contextmanager
def storage_guard(url: str | None) -> Iterator[None]:
    """Turn a lost study database inside the block into :class:`StorageLost` (one paragraph, exit 1)."""
    try:
        yield
    except TunerError:
        raise
    except Exception as err:
        lost = _lost_storage_error(err)
        if lost is None:
            raise
        where = f" {redact_value(url)}" if url else ""
        raise StorageLost(
            f"lost the study storage{where} ({redact(_first_line(getattr(lost, 'orig', None) or lost))}). {_LOST_HINT}"
        ) from None


@contextlib.contextmanager
def trial_heartbeat(storage: BaseStorage, trial_id: int) -> Iterator[None]:
    """Record a running trial's heartbeat every :data:`HEARTBEAT_S` while the block runs (Optuna does only inside
    ``optimize()``), so a trial whose process dies is found stale on any host. Unlike Optuna's thread (a
    traceback at the first failed write) this one logs a failure and keeps beating; the main thread's next
    write meets a lost database and reports it once (:func:`storage_guard`)."""
    from optuna.storages._heartbeat import BaseHeartbeat  # optuna is heavy: imported where a trial runs

    if not isinstance(storage, BaseHeartbeat) or (interval := storage.get_heartbeat_interval()) is None:
        yield  # heartbeats off: optuna's is_heartbeat_enabled
        return
    record = storage.record_heartbeat
    stop = threading.Event()

    def beat() -> None:
        while True:
            try:
                record(trial_id)
            except Exception as err:  # any failure: the main thread meets the loss and reports it
                logger.debug("heartbeat of trial %s not recorded: %s", trial_id, redact(_first_line(err)))
            if stop.wait(interval):
                return

    # A daemon: a beat stuck on a dead network must not keep the process alive once the command ends.
    thread = threading.Thread(target=beat, name=f"tuner-heartbeat-{trial_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=interval)


def _root_cause(err: BaseException) -> BaseException:
    """The error that started ``err`` (``raise ... from``): the driver's, which says what went wrong."""
    seen = {id(err)}
    while err.__cause__ is not None and id(err.__cause__) not in seen:
        err = err.__cause__
        seen.add(id(err))
    return err


def _first_line(err: BaseException) -> str:
    lines = [ln for ln in str(err).splitlines() if ln.strip()]
    return lines[0].strip()[:400] if lines else type(err).__name__
