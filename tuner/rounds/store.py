"""The SQLite file a run of paired rounds keeps its samples in, with the identity of the run they belong to.

A :class:`Table` says how a point key is stored. The identity (arch, backend, build, timer...) is written by the
first run into a ``meta`` table; a later run with another identity is refused, so one file never mixes two
builds' timings. Each sample is written as its process ends, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import time
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

from tuner import log
from tuner.errors import UsageError
from tuner.measure import exe

DEVICE = "device"
"""The identity key of the device a store's samples were measured on; compared where the file records one."""

K = TypeVar("K", bound=Hashable)


def device_identity(bin_dir: Path, backend: str) -> dict[str, str]:
    """``{DEVICE: ...}`` for a store's identity where the build names its backend's device, else nothing."""
    dev = exe.backend_device(Path(bin_dir), backend)
    return {DEVICE: dev} if dev else {}


def open_store(
    path: Path,
    identity: Mapping[str, str],
    *,
    table_sql: str,
    what: str,
    fix: str,
    strict: bool,
    legacy: Mapping[str, str] | None = None,
) -> sqlite3.Connection:
    """``path`` opened (made if new) with its samples table and ``identity`` checked against the one recorded,
    then recorded where it was not; UsageError for a file this cannot use or one with another identity.

    ``strict``: a recorded identity must have every key of this one; else only its recorded keys are compared
    (older files still resume). ``legacy``: keys added later, with the value older files were measured with."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        db = sqlite3.connect(path)
        db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        db.execute(table_sql)
        have = dict(db.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.Error as err:
        raise UsageError(f"{path} is not {what} this command can use ({err}).") from err
    if have and legacy:
        have = {**{k: str(v) for k, v in legacy.items()}, **have}
    want = {k: str(v) for k, v in identity.items()}
    if DEVICE in want and DEVICE in have and have[DEVICE] != want[DEVICE]:
        db.close()
        raise UsageError(
            f"{path} holds samples measured on {have[DEVICE]}, but this machine measures on {want[DEVICE]}. Its "
            "samples are compared with each other, so all of them must come from one device model; nothing was "
            "measured. Resume it on a machine with that device, or pass another storage (-o or --storage) to "
            "start one here."
        )
    # a file made before the device was recorded resumes, and records it from now on
    differ = {
        k: (have.get(k), v)
        for k, v in want.items()
        if k != DEVICE and (k in have or (strict and have)) and have.get(k) != v
    }
    if differ:
        db.close()
        raise UsageError(
            f"{path} holds a sweep with another "
            + ", ".join(f"{k} ({a!r}, not {b!r})" for k, (a, b) in sorted(differ.items()))
            + f"; its samples would mix with these. {fix}"
        )
    with db:
        db.executemany("INSERT OR IGNORE INTO meta VALUES (?, ?)", sorted(want.items()))
    return db


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sample(Generic[K]):
    """One (point, config, round): microseconds per op, or None with the reason it failed."""

    key: K
    config: str
    round: int
    us: float | None
    error: str = ""
    kernel: str | None = None

    @property
    def ok(self) -> bool:
        return self.us is not None and not self.error


Column = str | int


@dataclasses.dataclass(frozen=True, kw_only=True)
class Table(Generic[K]):
    """How one kind of point is stored. ``columns``: a point's columns, its key's ``n_key`` first; ``encode`` and
    ``decode`` map a key to them and back; ``value``: the time column; ``identity``: what every file records."""

    name: str
    create: str
    columns: tuple[str, ...]
    n_key: int
    encode: Callable[[K], tuple[Column, ...]]
    decode: Callable[[Sequence[Any]], K]  # a SQLite row: its values' types are the file's
    value: str
    kernel: bool = False
    identity: Mapping[str, str]
    what: str
    fix: str
    strict: bool
    legacy: Mapping[str, str] = dataclasses.field(default_factory=dict)


class SampleStore(Generic[K]):
    """Samples in a SQLite file (one row per point, config and round) and the identity of their run."""

    def __init__(self, table: Table[K], path: Path, identity: Mapping[str, str]) -> None:
        self.table = table
        self.path = Path(path)
        self.db = open_store(
            self.path,
            {**table.identity, **identity},
            table_sql=table.create,
            what=table.what,
            fix=table.fix,
            strict=table.strict,
            legacy=table.legacy,
        )
        self._cols = ", ".join(table.columns)

    def close(self) -> None:
        self.db.close()

    def set_limits(self, limits: tuple[int, int]) -> None:
        """Record a run's round limits in ``meta``; a later run may change them, so they are no part of the identity."""
        with self.db:
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('limits', ?)", (f"{limits[0]},{limits[1]}",))

    def limits(self) -> tuple[int, int]:
        """The round limits of the last run; (n, n) for a file made before they were recorded (fixed rounds)."""
        row = self.db.execute("SELECT value FROM meta WHERE key = 'limits'").fetchone()
        if row is not None:
            lo, hi = (int(x) for x in str(row[0]).split(","))
            return lo, hi
        n = int(self.db.execute(f"SELECT coalesce(max(round), -1) + 1 FROM {self.table.name}").fetchone()[0])
        return n, n

    def recorded(self, config: str, round_index: int) -> set[K]:
        """The key of every sample of ``config`` in round ``round_index``, failed ones included."""
        rows = self.db.execute(
            f"SELECT {self._cols} FROM {self.table.name} WHERE config = ? AND round = ?", (config, round_index)
        )
        return {self.table.decode(row) for row in rows}

    def forget(self, round_index: int, keys: Iterable[K]) -> None:
        """Delete every config's sample of round ``round_index`` at the points ``keys``."""
        t = self.table
        where = " AND ".join(f"{c} = ?" for c in t.columns[: t.n_key])
        with self.db:
            self.db.executemany(
                f"DELETE FROM {t.name} WHERE {where} AND round = ?",
                [(*t.encode(k)[: t.n_key], round_index) for k in keys],
            )

    def add(self, samples: Iterable[Sample[K]]) -> None:
        t, now = self.table, time.time()
        cols = [*t.columns, "config", "round", t.value, *(["kernel"] if t.kernel else []), "error", "at"]
        rows = [
            (*t.encode(s.key), s.config, s.round, s.us, *([s.kernel] if t.kernel else []), s.error, now)
            for s in samples
        ]
        with self.db:
            self.db.executemany(
                f"INSERT OR REPLACE INTO {t.name} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})", rows
            )

    def samples(self, among: Iterable[K] | None = None) -> list[Sample[K]]:
        """Every stored sample, ordered by key, config and round; with ``among``, only of the points that share
        their first column with one of those keys."""
        t = self.table
        firsts = None if among is None else list(dict.fromkeys(t.encode(k)[0] for k in among))
        where = "" if firsts is None else f" WHERE {t.columns[0]} IN ({', '.join('?' * len(firsts))})"
        kernel = "kernel" if t.kernel else "NULL"
        rows = self.db.execute(
            f"SELECT {self._cols}, config, round, {t.value}, {kernel}, error FROM {t.name}{where} "
            f"ORDER BY {', '.join(t.columns[: t.n_key])}, config, round",
            firsts or (),
        )
        n = len(t.columns)
        return [
            Sample(
                key=t.decode(row[:n]),
                config=str(row[n]),
                round=int(row[n + 1]),
                us=None if row[n + 2] is None else float(row[n + 2]),
                kernel=None if row[n + 3] is None else str(row[n + 3]),
                error=str(row[n + 4]),
            )
            for row in rows
        ]

    def whole_round(self, want: Mapping[str, Collection[K]], r: int, what: str) -> list[tuple[str, set[K]]]:
        """(config, its keys still to measure) of round ``r``, in ``want``'s order. A round is paired, so one
        partly stored (cut off by an earlier call, maybe on another machine) is forgotten and measured again whole."""
        have = {cfg: self.recorded(cfg, r) & set(ks) for cfg, ks in want.items()}
        missing = {cfg: set(ks) - have[cfg] for cfg, ks in want.items()}
        if any(have.values()) and any(missing.values()):
            self.forget(r, {k for ks in want.values() for k in ks})
            log.info(f"{what}: partly measured by an earlier call; measuring it again whole, its configs back to back")
            missing = {cfg: set(ks) for cfg, ks in want.items()}
        return list(missing.items())


def read_store(table: Table[K], path: Path) -> tuple[list[Sample[K]], tuple[int, int]]:
    """A storage's samples and round limits, the file closed after."""
    store = SampleStore(table, path, {})
    try:
        return store.samples(), store.limits()
    finally:
        store.close()
