"""Where a study lives: the Optuna storage a search writes and an export reads (SQLite in the run
directory by default, or PostgreSQL shared by several hosts), and the check of a ``--storage`` URL."""

from __future__ import annotations

__all__ = ["GRACE_S", "HEARTBEAT_S", "STORAGE_DIALECTS", "check_storage_url", "make_storage"]

import re
import warnings
from pathlib import Path
from typing import Any

from tuner.errors import UsageError
from tuner.redact import redact

STORAGE_DIALECTS = ("sqlite", "postgresql", "postgres", "mysql", "mariadb")
"""Database dialects an Optuna RDB storage URL may name (``dialect[+driver]://...``)."""

_URL = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*)://(?P<rest>.*)", re.DOTALL)


def check_storage_url(url: str) -> str:
    """``url`` unchanged when it names a database that keeps the study; else a UsageError (exit 2).

    Refused: anything that is not ``dialect[+driver]://...`` with a known dialect, an in-memory SQLite
    (``sqlite://``, ``sqlite:///``, ``:memory:``, ``mode=memory``: nothing would be saved, yet a rerun
    is promised to resume), a SQLite file whose folder does not exist (SQLAlchemy would fail, or tuner
    would create folders outside the run dir unasked), a bad port. Passwords stay out of the message.
    """
    shown = redact(url)
    fix = (
        "Pass --storage sqlite:///PATH/study.db (an existing folder), postgresql://USER@HOST/DB, or leave "
        "--storage out for a SQLite study in the run dir."
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
        memory = (
            not path.startswith("/")
            or path in ("/", "/:memory:")
            or ":memory:" in path
            or "mode=memory" in query.lower()
        )
        if memory:
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
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a non-numeric or out-of-range port
    except ValueError as err:
        raise UsageError(f"--storage {shown!r} does not parse as a URL ({redact(err)}). {fix}") from None
    if not parts.hostname and "host=" not in parts.query:
        raise UsageError(f"--storage {shown!r} names no database host. {fix}")
    return url


def make_storage(url: str) -> Any:
    """An Optuna RDB storage for ``url`` (checked by :func:`check_storage_url`), with heartbeats so a
    trial whose process died is failed and run again; UsageError when it cannot be opened."""
    import optuna

    check_storage_url(url)
    try:
        with warnings.catch_warnings():
            # Heartbeats and stale-trial retry are experimental in Optuna 5; we rely on them knowingly.
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(
                url,
                heartbeat_interval=HEARTBEAT_S,
                grace_period=GRACE_S,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=2),
                engine_kwargs={"pool_pre_ping": True} if url.startswith("postgresql") else None,
            )
    except ImportError as err:
        from tuner.extras import missing_module_error

        raise missing_module_error(err) or UsageError(
            f"storage {redact(url)!r} needs a database driver that is not installed ({err})."
        ) from None
    except Exception as err:  # sqlalchemy OperationalError and friends
        raise UsageError(
            f"cannot open the study storage {redact(url)!r}: {redact(_first_line(err))}. Check the URL, that the server "
            "is up and that the database exists (createdb NAME)."
        ) from None


HEARTBEAT_S = 10
"""Seconds between a running tune trial's heartbeats (a thread records them in the storage)."""
GRACE_S = 60
"""A RUNNING trial without a heartbeat for this long belongs to a process that died: it is failed and
re-run (Optuna's fail_stale_trials; a retry copy of it is queued)."""


def _first_line(err: BaseException) -> str:
    lines = [ln for ln in str(err).splitlines() if ln.strip()]
    return lines[0].strip()[:400] if lines else type(err).__name__
