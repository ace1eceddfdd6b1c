"""The SQLite file a sweep keeps its samples in, with the identity of the run they belong to.

The identity (arch, backend, build, timer...) is written by the first run into a ``meta`` table; a later
run with another identity is refused, so one file never mixes two builds' timings.
"""

from __future__ import annotations

__all__ = ["DEVICE", "RoundStore", "device_identity", "open_store", "read_limits", "whole_round", "write_limits"]

import sqlite3
from collections.abc import Collection, Hashable, Iterable, Mapping
from pathlib import Path
from typing import Protocol, TypeVar

from tuner.errors import UsageError

DEVICE = "device"
"""The identity key of the device a store's samples were measured on (``llama-bench --list-devices``'s
description); compared where the file records one, recorded where it does not."""


def device_identity(bin_dir: Path, backend: str) -> dict[str, str]:
    """``{DEVICE: ...}`` for a store's identity where the build names its backend's device, else nothing."""
    from tuner.measure.device import backend_device

    dev = backend_device(Path(bin_dir), backend)
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
    """``path`` opened (made if new) with its samples table (``table_sql``, a ``CREATE TABLE IF NOT EXISTS``)
    and ``identity`` checked against the one recorded, then recorded where it was not.

    ``strict``: a file that records an identity must record every key of this one (a file of another
    kind of sweep lacks this kind's keys); otherwise only the keys it records are compared (files made
    before a key was added still resume). ``legacy``: keys added later, with the value a file that records
    an identity without them was measured with (what the sweep did before the key existed), so such a file
    resumes where that value is asked for and is refused otherwise. ``what`` names the storage and ``fix``
    ends the refusal.

    Raises:
        UsageError: Not a SQLite file this can use, or one with another identity.
    """
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


def write_limits(db: sqlite3.Connection, limits: tuple[int, int]) -> None:
    """Record a run's round limits (min_rounds, max_rounds: the looks its verdicts spend alpha over) in
    ``meta``; a later run may change them (more rounds for the points still open), so they are no part of
    the identity."""
    with db:
        db.execute("INSERT OR REPLACE INTO meta VALUES ('limits', ?)", (f"{limits[0]},{limits[1]}",))


def read_limits(db: sqlite3.Connection, table: str) -> tuple[int, int]:
    """The round limits of the last run; a file made before they were recorded was measured with a fixed
    number of rounds, every round its samples ``table`` holds (one look)."""
    row = db.execute("SELECT value FROM meta WHERE key = 'limits'").fetchone()
    if row is not None:
        lo, hi = (int(x) for x in str(row[0]).split(","))
        return lo, hi
    n = int(db.execute(f"SELECT coalesce(max(round), -1) + 1 FROM {table}").fetchone()[0])
    return n, n


K = TypeVar("K", bound=Hashable)


class RoundStore(Protocol[K]):
    """What :func:`whole_round` needs of a sweep store: the keys a config has in a round, and forgetting them."""

    def recorded(self, config: str, round_index: int) -> set[K]: ...

    def forget(self, round_index: int, keys: Iterable[K]) -> None: ...


def whole_round(store: RoundStore[K], want: Mapping[str, Collection[K]], r: int, what: str) -> list[tuple[str, set[K]]]:
    """(config, its keys still to measure) of round ``r`` (0-based), in ``want``'s order (config -> the keys
    its process times in the round).

    A round is paired: its configs' ratios are taken within it, so they must run back to back on one machine.
    A round partly stored (one config's samples there, another's missing) was cut off by an earlier call,
    which may have run on another machine hours before; it is forgotten and measured again whole."""
    from tuner import log

    have = {cfg: store.recorded(cfg, r) & set(ks) for cfg, ks in want.items()}
    missing = {cfg: set(ks) - have[cfg] for cfg, ks in want.items()}
    if any(have.values()) and any(missing.values()):
        store.forget(r, {k for ks in want.values() for k in ks})
        log.info(f"{what}: partly measured by an earlier call; measuring it again whole, its configs back to back")
        missing = {cfg: set(ks) for cfg, ks in want.items()}
    return list(missing.items())
