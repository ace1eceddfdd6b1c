"""The confirm's storage (``confirm.sqlite3``): rounds, gate checks and recorded models, the unit that travels
between machines; :mod:`tuner.sweep.confirm` measures and decides.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tuner.rounds.store import open_store

_SCHEMA = 1


class ConfirmStore:
    """The rounds' records (one row per model, phase and round, the search's record as JSON) and the gate's
    checks, in SQLite; the identity (build, quant, the table's env per model...) is checked on reopening."""

    def __init__(self, path: Path, identity: Mapping[str, str]) -> None:
        self.path = Path(path)
        self.db = open_store(
            self.path,
            {"schema": str(_SCHEMA), "sweep": "confirm", **identity},
            table_sql="CREATE TABLE IF NOT EXISTS rounds (model TEXT NOT NULL, phase TEXT NOT NULL, "
            "round INTEGER NOT NULL, record TEXT NOT NULL, at REAL NOT NULL, PRIMARY KEY (model, phase, round))",
            what="a sweep confirm storage",
            fix="Pass another -o or --storage, or the same build, --quant, -r and sweep table.",
            strict=True,
        )
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS gate (model TEXT NOT NULL, name TEXT NOT NULL, record TEXT NOT NULL, "
            "PRIMARY KEY (model, name))"
        )
        self.db.execute("CREATE TABLE IF NOT EXISTS models (ord INTEGER PRIMARY KEY, record TEXT NOT NULL)")

    def close(self) -> None:
        self.db.close()

    def records(self, model: str) -> list[dict[str, Any]]:
        rows = self.db.execute("SELECT record FROM rounds WHERE model = ? ORDER BY phase, round", (model,))
        return [json.loads(r) for (r,) in rows]

    def add(self, model: str, rec: Mapping[str, Any]) -> None:
        with self.db:
            self.db.execute(
                "INSERT OR REPLACE INTO rounds VALUES (?, ?, ?, ?, ?)",
                (model, rec["phase"], int(rec["round"]), json.dumps(rec), time.time()),
            )

    def gate(self, model: str) -> dict[str, Any]:
        rows = self.db.execute("SELECT name, record FROM gate WHERE model = ?", (model,))
        return {str(n): json.loads(r) for n, r in rows}

    def add_gate(self, model: str, name: str, rec: Mapping[str, object]) -> None:
        with self.db:
            self.db.execute("INSERT OR REPLACE INTO gate VALUES (?, ?, ?)", (model, name, json.dumps(rec)))

    def set_models(self, rows: Sequence[Mapping[str, object]]) -> None:
        """The models of the last call with their ``weight_types``, so :func:`recompose` can decide again."""
        with self.db:
            self.db.execute("DELETE FROM models")
            self.db.executemany("INSERT INTO models VALUES (?, ?)", [(i, json.dumps(r)) for i, r in enumerate(rows)])

    def models(self) -> list[dict[str, Any]]:
        return [json.loads(r) for (r,) in self.db.execute("SELECT record FROM models ORDER BY ord")]
