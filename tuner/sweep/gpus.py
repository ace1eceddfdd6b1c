"""One sweep table on several GPU models of its arch: their confirmations kept side by side, their verdicts joined.

The patch keys on the compute capability, which models share (H100 and H200: sm_90); :func:`join` patches an
entry faster on some model and worse on none, drops it where models disagree. See docs/sweep.md.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from contextlib import closing
from pathlib import Path
from typing import Literal

from tuner._compat import tomllib
from tuner.errors import UsageError
from tuner.paths import package_data
from tuner.sweep.confirm import Confirmed, ConfirmStore, RuleFate, Table, recompose, store_meta, table_id

Action = Literal["patched", "dropped", "reported"]

# A model's verdict on an entry, from the keep rule's reason (tuner.rounds.keep): the worst of its confirmations.
_WORDS = {
    "gate": "gate failed",
    "slower": "slower",
    "faster": "faster",
    "no gain": "no gain",
    "noisy": "too noisy",
    "cpu": "CPU% up",
    "none": "not measured",
}
_RANK = ("gate failed", "slower", "faster", "no gain", "too noisy", "CPU% up", "not measured")
_AGAINST = ("gate failed", "slower")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Confirmation:
    """One ``tuner sweep confirm`` store of one table (a merged table's part) on one GPU model, recomposed."""

    device: str
    part: str
    folder: str
    """``parts/<part>/evidence`` (the first GPU model's) or ``gpus/<slug(device)>/<name>``."""
    identity: Mapping[str, str]
    confirmed: Confirmed
    models: tuple[Mapping[str, object], ...]
    """The models its store recorded (what the ``tuner sweep confirm`` call was)."""
    backend_ops: tuple[Mapping[str, object], ...]

    @property
    def name(self) -> str:
        return self.folder.rsplit("/", 1)[-1]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Verdict:
    device: str
    word: str
    why: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Joined:
    """One entry decided over every GPU model that confirmed its table."""

    fate: RuleFate
    """The first model's fate (the entry's rule or MMQ choice, its text)."""
    action: Action
    verdicts: tuple[Verdict, ...]

    @property
    def kept(self) -> bool:
        return self.action == "patched"

    @property
    def why(self) -> str:
        if len(self.verdicts) == 1:  # one GPU model: its confirmation's words, as before models were joined
            return self.verdicts[0].why
        each = "; ".join(f"{v.device}: {v.why}" for v in self.verdicts)
        return f"GPU models disagree ({each})" if self.action == "dropped" else each


def slug(device: str) -> str:
    """``NVIDIA H200`` -> ``nvidia-h200``: a GPU model's folder name."""
    return re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "unknown"


def _device_verdict(device: str, fates: Sequence[RuleFate]) -> Verdict:
    """The worst of one model's fates of an entry (a slower confirmation outweighs a faster one)."""
    words = [(_WORDS.get(f.reason, "not measured"), f) for f in fates]
    word, fate = min(words, key=lambda wf: _RANK.index(wf[0]))
    return Verdict(device=device, word=word, why=fate.why)


def join(fates_by_device: Sequence[tuple[str, Sequence[RuleFate]]]) -> list[Joined]:
    """Each entry decided over every ``(device, fates)`` (the first GPU model's first; a model's worst verdict)."""
    if not fates_by_device:
        return []
    devices = list(dict.fromkeys(d for d, _ in fates_by_device))
    first = fates_by_device[0][1]
    for dev, fs in fates_by_device:
        if [f.text for f in fs] != [f.text for f in first]:
            raise UsageError(f"The {dev} confirmation decided other entries than the first one: not the same table.")
    out = []
    for i, fate in enumerate(first):
        verdicts = tuple(_device_verdict(d, [fs[i] for dev, fs in fates_by_device if dev == d]) for d in devices)
        words = {v.word for v in verdicts}
        action: Action = ("dropped" if words & set(_AGAINST) else "patched") if "faster" in words else "reported"
        out.append(Joined(fate=fate, action=action, verdicts=verdicts))
    return out


def load_confirmation(store_path: Path, tables: Mapping[str, Table], *, name: str, first_device: str) -> Confirmation:
    """Another GPU model's confirm store recomposed against the table it recorded (pass a copy); UsageError."""
    meta = store_meta(store_path, "sweep confirm storage")
    if meta.get("sweep") != "confirm":
        raise UsageError(f"{store_path} is not the storage of `tuner sweep confirm`.")
    device = meta.get("device", "")
    if not device:
        raise UsageError(
            f"{store_path} records no GPU model (a confirmation older than the device record): it cannot stand as "
            "another GPU model's evidence."
        )
    if device == first_device:
        raise UsageError(
            f"{store_path} was measured on {device}, the GPU model the table's own evidence is of; --gpu takes "
            "confirmations made on other GPU models of the arch."
        )
    ids = {table_id(t): part for part, t in tables.items()}
    part = ids.get(meta.get("table", ""))
    if part is None:
        raise UsageError(
            f"{store_path} confirmed table {meta.get('table', '?')}, which is none of the tables merged "
            f"({', '.join(f'{p}: {i}' for i, p in ids.items())}): run `tuner sweep confirm` on that table's sweeps."
        )
    table = tables[part]
    if meta.get("arch") != table.arch.name:
        raise UsageError(f"{store_path} was confirmed for {meta.get('arch')}, the table is {table.arch.name}.")
    with closing(ConfirmStore(store_path, {})) as store:
        conf = recompose(table, store)
        models = tuple(store.models())
        ops = tuple(rec for _, rec in sorted(store.gate("test-backend-ops").items()))
    folder = f"gpus/{slug(device)}/{name}"
    return Confirmation(
        device=device, part=part, folder=folder, identity=meta, confirmed=conf, models=models, backend_ops=ops
    )


def gpu_specs() -> dict[str, dict[str, object]]:
    """Datasheet figures by GPU model name (``tuner/data/gpus.toml``), each with its source."""
    text = package_data("gpus.toml").read_text()
    return {k: dict(v) for k, v in tomllib.loads(text).items() if isinstance(v, dict)}


_FIELDS = (
    ("memory_bandwidth_tbs", "memory bandwidth", "TB/s"),
    ("sms", "SM count", ""),
    ("max_sm_clock_mhz", "max SM clock", "MHz"),
)


def differs(devices: Sequence[str]) -> str:
    """What separates ``devices`` by their datasheets, in words (the key a patch would need), or ''."""
    specs = gpu_specs()
    if not all(d in specs for d in devices):
        return ""
    for key, words, unit in _FIELDS:
        vals = [specs[d].get(key) for d in devices]
        if None not in vals and len(set(map(str, vals))) > 1:
            each = " vs ".join(f"{v}{' ' + unit if unit else ''}" for v in vals)
            return f"{words} ({each})"
    return ""
