"""Search spaces: ``search_spaces/<arch>.toml`` -> :class:`SearchSpace`.

Each arch file has one table per llama.cpp era (``[era.mma]``, ``[era.rocwmma]``) with the build
variants (first = upstream default), compile-time knobs (kernel table rows, WMMA parameters) and
runtime knobs (forced-kernel rules, selector thresholds, env vars, llama-bench flags). Every knob
carries its upstream default, so a study can always enqueue the baseline first.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna.distributions as od

from tuner._compat import tomllib
from tuner.errors import UsageError, close_matches
from tuner.pairs import parse_pairs
from tuner.paths import data_dir
from tuner.plan.constraints import (
    MmaRow,
    TileRow,
    Violation,
    check_candidate,
    load_arch_limits,
    parse_mma_tables,
    parse_tile_tables,
    with_fields,
)
from tuner.plan.fa_rules import FaRule, Phase, rules_env
from tuner.plan.variant import VARIANTS

COMPILE_KINDS = ("tile_row", "mma_row", "wmma")
RUNTIME_KINDS = ("rule", "threshold", "env", "bench_flag")
_KERNELS = ("default", "VEC", "TILE", "MMA")
_TILE_TABLES = ("nvidia_fp16", "nvidia_fp32", "amd", "amd_rdna")
_MMA_TABLES = ("ampere", "turing", "volta", "rdna", "cdna")
# a row's tunable fields: those after its (dkq, dv, ncols) key
_TILE_FIELDS = tuple(f.name for f in dataclasses.fields(TileRow))[3:]
_MMA_FIELDS = tuple(f.name for f in dataclasses.fields(MmaRow))[3:]
_WMMA_FIELDS = ("nwarps", "min_blocks", "kq_stride")
_BENCH_FLAGS = ("-ub", "-b", "-t", "-fa", "-ctk", "-ctv", "-ngl", "-nkvo", "-sm", "-mg")
_COMMON_KEYS = ("name", "kind", "choices", "low", "high", "step", "log", "default", "help", "phases")
_KIND_KEYS: dict[str, tuple[str, ...]] = {
    "tile_row": ("table", "dkq", "dv", "ncols", "field"),
    "mma_row": ("table", "dkq", "dv", "ncols", "ncols2", "field"),
    "wmma": ("field",),
    "rule": ("phase", "lo", "hi"),
    "threshold": ("id",),
    "env": ("env",),
    "bench_flag": ("flag", "derive"),
}
_OPTIONAL_KIND_KEYS = {"hi", "derive"}
DERIVED_FLAGS = {"threads": "-t", "ngl": "-ngl"}
"""``derive`` values of a bench_flag knob and the flag each needs: legal values resolved at search
time from the machine and the model (:mod:`tuner.plan.derive`), never a list typed into the file."""
BENCH_DEFAULT = "default"
"""A bench_flag value that passes no flag: llama-bench's own default (upstream's behaviour)."""


class SpaceNotFound(UsageError):
    """No search-space file (or no section for the era) for an arch."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Knob:
    """One tunable parameter."""

    name: str
    kind: str
    """One of COMPILE_KINDS or RUNTIME_KINDS."""
    default: int | str
    """The upstream value (for ``rule`` knobs: ``"default"``, i.e. upstream's own choice)."""
    choices: tuple[int | str, ...] | None = None
    """What the tune stage samples. A derived knob also has low/high: the range a pin may take."""
    low: int | None = None
    high: int | None = None
    step: int = 1
    log: bool = False
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Kind-specific keys: table/dkq/dv/ncols/ncols2/field, phase/lo/hi, id, env, flag."""
    help: str = ""

    def to_optuna_distribution(self) -> od.BaseDistribution:
        """The Optuna distribution to sample this knob from."""
        if self.choices is not None:
            return od.CategoricalDistribution(list(self.choices))
        assert self.low is not None and self.high is not None
        if self.log:
            return od.IntDistribution(self.low, self.high, log=True)
        return od.IntDistribution(self.low, self.high, step=self.step)

    def allowed(self) -> str:
        """Human text of the allowed values."""
        if self.choices is not None:
            return ", ".join(str(c) for c in self.choices)
        return f"integers {self.low}..{self.high}" + (f" in steps of {self.step}" if self.step != 1 else "")

    def coerce(self, value: object) -> int | str:
        """Type- and range-check one value (strings from --set are converted); UsageError names the allowed ones."""
        text = str(value).strip()
        v: int | str = text
        if (
            self.choices is None
            or all(isinstance(c, int) for c in self.choices)
            # a number for a knob mixing "default" and integers (threads, -ngl)
            or (re.fullmatch(r"-?\d+", text) and (self.low is not None or int(text) in self.choices))
        ):
            try:
                v = int(value) if isinstance(value, bool) else int(text)
            except ValueError:
                msg = f"Knob {self.name!r} takes an integer, got {value!r}. Allowed: {self.allowed()}."
                raise UsageError(msg) from None
        if self.choices is not None and self.low is not None:  # derived: sampled choices, any pin in range
            if v not in self.choices and not (isinstance(v, int) and self.low <= v <= int(self.high or 0)):
                raise UsageError(f"Knob {self.name!r} does not allow {v!r}: {self.meta.get('legal', self.allowed())}.")
            return v
        if self.choices is not None:
            ok = v in self.choices
        else:
            assert self.low is not None and self.high is not None
            ok = isinstance(v, int) and self.low <= v <= self.high and (self.log or not (v - self.low) % self.step)
        if not ok:
            raise UsageError(f"Knob {self.name!r} does not allow {v!r}. Allowed: {self.allowed()}.")
        return v


@dataclasses.dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """The knobs of one arch and era."""

    arch: str
    era: str
    path: Path
    variants: tuple[str, ...]
    """Build variants; the first is the upstream default."""
    compile_knobs: tuple[Knob, ...]
    runtime_knobs: tuple[Knob, ...]

    @property
    def knobs(self) -> tuple[Knob, ...]:
        return self.compile_knobs + self.runtime_knobs

    def knob(self, name: str) -> Knob:
        """Look a knob up by name; UsageError with suggestions for an unknown one."""
        for k in self.knobs:
            if k.name == name:
                return k
        names = [k.name for k in self.knobs]
        raise UsageError(
            f"Unknown knob {name!r} for {self.arch} (era {self.era}, {self.path}).{close_matches(name, names)} "
            f"Known knobs: {', '.join(names) or 'none'}."
        )

    def defaults(self, section: str = "all") -> dict[str, int | str]:
        """Knob name -> upstream default (``compile``, ``runtime`` or ``all``)."""
        knobs = {"compile": self.compile_knobs, "runtime": self.runtime_knobs, "all": self.knobs}[section]
        return {k.name: k.default for k in knobs}


def _err(path: Path, where: str, msg: str) -> UsageError:
    return UsageError(f"{path}: {where}: {msg}")


def _only_keys(doc: Iterable[str], allowed: Sequence[str], path: Path, where: str, label: str = "Allowed") -> None:
    for key in doc:
        if key not in allowed:
            msg = f"unknown key {key!r}.{close_matches(key, list(allowed))} {label}: {', '.join(allowed)}."
            raise _err(path, where, msg)


def _parse_knob(path: Path, era: str, section: str, i: int, raw: Mapping[str, Any]) -> Knob:
    where = f"[era.{era}] {section} knob #{i + 1}" + (f" ({raw['name']!r})" if "name" in raw else "")
    kinds = COMPILE_KINDS if section == "compile" else RUNTIME_KINDS
    for req in ("name", "kind", "default"):
        if req not in raw:
            raise _err(path, where, f"missing key {req!r}.")
    kind = raw["kind"]
    if kind not in kinds:
        msg = f"kind {kind!r} is not allowed in [{section}]; allowed: {', '.join(kinds)}.{close_matches(str(kind), kinds)}"
        raise _err(path, where, msg)
    _only_keys(raw, _COMMON_KEYS + _KIND_KEYS[kind], path, where, f"Allowed keys for kind {kind}")
    meta = {k: raw[k] for k in _KIND_KEYS[kind] if k in raw}
    if "phases" in raw:  # the phases a knob can affect: the tune stage measures it only there
        ph = raw["phases"]
        if not isinstance(ph, list) or not ph or not set(ph) <= {"pp", "tg"} or len(set(ph)) != len(ph):
            raise _err(path, where, f'phases {ph!r} must be a non-empty list drawn from "pp" and "tg".')
        meta["phases"] = tuple(ph)
    for k in _KIND_KEYS[kind]:
        if k not in raw and k not in _OPTIONAL_KIND_KEYS:
            raise _err(path, where, f"kind {kind} needs key {k!r}.")
    _check_meta(path, where, kind, meta)
    if "derive" in meta:
        if "choices" in raw or "low" in raw or "high" in raw or raw.get("default") != BENCH_DEFAULT:
            msg = (
                f"a derived knob (derive = {meta['derive']!r}) gets its legal values at search time: "
                f"give no choices/low/high and default = {BENCH_DEFAULT!r} (llama-bench's own default)."
            )
            raise _err(path, where, msg)
        raw = {**raw, "choices": [BENCH_DEFAULT]}  # until tuner.plan.derive resolves it for a machine and model
    choices = raw.get("choices")
    if choices is not None:
        if "low" in raw or "high" in raw:
            raise _err(path, where, "give either choices or low/high, not both.")
        if (
            not isinstance(choices, list)
            or not choices
            or not all(isinstance(c, (int, str)) and not isinstance(c, bool) for c in choices)
        ):
            raise _err(path, where, "choices must be a non-empty list of integers or strings.")
        if len(set(choices)) != len(choices):
            raise _err(path, where, f"choices {choices} has duplicates.")
        if section == "compile" and not all(isinstance(c, int) for c in choices):
            raise _err(path, where, "compile-time choices must be integers.")
        if kind == "rule":
            bad = [c for c in choices if c not in _KERNELS]
            if bad:
                raise _err(path, where, f"rule choices {bad} are not kernels; allowed: {', '.join(_KERNELS)}.")
    else:
        for k in ("low", "high"):
            if not isinstance(raw.get(k), int) or isinstance(raw.get(k), bool):
                raise _err(path, where, f"give choices = [...] or integer low and high (missing/bad {k!r}).")
        if raw["low"] > raw["high"]:
            raise _err(path, where, f"low {raw['low']} > high {raw['high']}.")
        if raw.get("log") and raw["low"] < 1:
            raise _err(path, where, "log scale needs low >= 1.")
        if not isinstance(raw.get("step", 1), int) or raw.get("step", 1) < 1:
            raise _err(path, where, "step must be a positive integer.")
    knob = Knob(
        name=str(raw["name"]),
        kind=kind,
        default=raw["default"],
        choices=tuple(choices) if choices is not None else None,
        low=raw.get("low"),
        high=raw.get("high"),
        step=int(raw.get("step", 1)),
        log=bool(raw.get("log", False)),
        meta=meta,
        help=str(raw.get("help", "")),
    )
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+", knob.name):
        raise _err(path, where, f"name {knob.name!r} may only use letters, digits, '_', '.', '-'.")
    if raw["default"] == "upstream" and kind in ("tile_row", "mma_row"):
        return knob  # resolved against a tree by resolve_upstream_defaults()
    try:
        knob = dataclasses.replace(knob, default=knob.coerce(raw["default"]))
    except UsageError as err:
        raise _err(path, where, f"default {raw['default']!r} is not allowed ({err}).") from None
    return knob


def _check_meta(path: Path, where: str, kind: str, meta: Mapping[str, Any]) -> None:
    def need(key: str, allowed: Sequence[object]) -> None:
        if meta[key] not in allowed:
            msg = f"{key} {meta[key]!r} is not one of {', '.join(map(str, allowed))}.{close_matches(str(meta[key]), map(str, allowed))}"
            raise _err(path, where, msg)

    def pos_int(key: str) -> None:
        if not isinstance(meta.get(key), int) or isinstance(meta.get(key), bool) or meta[key] < 1:
            raise _err(path, where, f"{key} must be a positive integer, got {meta.get(key)!r}.")

    if kind in ("tile_row", "mma_row"):
        tile = kind == "tile_row"
        need("table", _TILE_TABLES if tile else _MMA_TABLES)
        need("field", _TILE_FIELDS if tile else _MMA_FIELDS)
        for k in _KIND_KEYS[kind][1:-1]:  # dkq, dv, ncols (and an MMA row's ncols2)
            pos_int(k)
        if not tile and meta["ncols"] % meta["ncols2"]:
            raise _err(path, where, f"ncols {meta['ncols']} is not a multiple of ncols2 {meta['ncols2']}.")
    elif kind == "wmma":
        need("field", _WMMA_FIELDS)
    elif kind == "rule":
        need("phase", ("decode", "prefill"))
        if not isinstance(meta["lo"], int) or meta["lo"] < 0:
            raise _err(path, where, f"lo must be an integer >= 0, got {meta['lo']!r}.")
        if "hi" in meta and (not isinstance(meta["hi"], int) or meta["hi"] <= meta["lo"]):
            raise _err(path, where, f"hi must be an integer > lo (omit it for unbounded), got {meta['hi']!r}.")
    elif kind == "threshold":
        need("id", range(1, 9))
    elif kind == "env":
        if not isinstance(meta["env"], str) or not re.fullmatch(r"[A-Z][A-Z0-9_]*", meta["env"]):
            raise _err(path, where, f"env {meta['env']!r} must be an upper-case environment variable name.")
    elif kind == "bench_flag":
        need("flag", _BENCH_FLAGS)
        if "derive" in meta:
            need("derive", tuple(DERIVED_FLAGS))
            if meta["flag"] != DERIVED_FLAGS[meta["derive"]]:
                msg = f"derive = {meta['derive']!r} derives {DERIVED_FLAGS[meta['derive']]} values, not {meta['flag']}."
                raise _err(path, where, msg)


def parse_space(doc: Mapping[str, Any], *, path: Path, arch: str, era: str) -> SearchSpace:
    """Validate one parsed search-space document and return the era's space.

    Raises UsageError naming the file, the key and the allowed values; SpaceNotFound without an ``era`` section.
    """
    _only_keys(doc, ("arch", "description", "era"), path, "top level")
    if doc.get("arch", arch) != arch:
        raise _err(path, "top level", f"arch = {doc['arch']!r} but the file is for {arch!r}.")
    eras = doc.get("era", {})
    for e in eras:
        if e not in ("mma", "rocwmma"):
            raise _err(path, f"[era.{e}]", f"unknown era.{close_matches(e, ['mma', 'rocwmma'])} Allowed: mma, rocwmma.")
    if era not in eras:
        msg = f"{path} has no [era.{era}] section; {arch} is not tuned for era {era}. Eras in the file: {', '.join(eras) or 'none'}."
        raise SpaceNotFound(msg)
    sec = eras[era]
    _only_keys(sec, ("variants", "compile", "runtime"), path, f"[era.{era}]")
    variants = sec.get("variants", [])
    where = f"[era.{era}] variants"
    if not variants or not all(isinstance(v, str) for v in variants):
        raise _err(path, where, "must be a non-empty list of variant names (first = upstream default).")
    for v in variants:
        if v not in VARIANTS:
            raise _err(path, where, f"unknown variant {v!r}.{close_matches(v, VARIANTS)} Known: {', '.join(VARIANTS)}.")
    compile_knobs = tuple(_parse_knob(path, era, "compile", i, k) for i, k in enumerate(sec.get("compile", [])))
    runtime_knobs = tuple(_parse_knob(path, era, "runtime", i, k) for i, k in enumerate(sec.get("runtime", [])))
    names = [k.name for k in compile_knobs + runtime_knobs]
    if (twice := next((n for i, n in enumerate(names) if n in names[:i]), None)) is not None:
        raise _err(path, f"[era.{era}]", f"knob name {twice!r} is used twice.")
    return SearchSpace(
        arch=arch,
        era=era,
        path=path,
        variants=tuple(variants),
        compile_knobs=compile_knobs,
        runtime_knobs=runtime_knobs,
    )


def load_space(arch: str, era: str, *, path: Path | None = None) -> SearchSpace:
    """Load ``search_spaces/<arch>.toml`` (or ``path``) and return the space for ``era``.

    Raises SpaceNotFound without a file for the arch or a section for the era, UsageError when it breaks the schema.
    """
    if path is None:
        folder = data_dir("search_spaces")
        path = folder / f"{arch}.toml"
        if not path.is_file():
            known = sorted(p.stem for p in folder.glob("*.toml"))
            msg = f"No search space for arch {arch!r} ({path}).{close_matches(arch, known)} Known: {', '.join(known)}."
            raise SpaceNotFound(msg)
    try:
        doc = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise UsageError(f"{path} is not valid TOML: {err}.") from err
    return parse_space(doc, path=path, arch=arch, era=era)


def check_values(sp: SearchSpace, values: Mapping[str, object], *, section: str = "all") -> dict[str, int | str]:
    """Knob values coerced to the knob types; UsageError for an unknown knob, wrong section or value not allowed."""
    out: dict[str, int | str] = {}
    for name, value in values.items():
        knob = sp.knob(name)
        if section == "compile" and knob.kind not in COMPILE_KINDS:
            raise UsageError(f"Knob {name!r} is a runtime knob ({knob.kind}); it cannot be a compile-time value.")
        if section == "runtime" and knob.kind not in RUNTIME_KINDS:
            raise UsageError(f"Knob {name!r} is a compile-time knob ({knob.kind}); it cannot be a runtime value.")
        out[name] = knob.coerce(value)
    return out


def parse_set_values(sp: SearchSpace, items: Sequence[str]) -> tuple[dict[str, int], dict[str, int | str]]:
    """:func:`set_values` of ``KNOB=VALUE`` strings (:func:`tuner.pairs.parse_pairs`); UsageError for a malformed one."""
    return set_values(sp, parse_pairs(items, "--set", "T3=4096", what="KNOB"))


def set_values(sp: SearchSpace, pairs: Mapping[str, object]) -> tuple[dict[str, int], dict[str, int | str]]:
    """Knob values checked against the space: ``(compile_values, runtime_values)``; UsageError for an unknown
    knob or a value it does not allow."""
    compile_values: dict[str, int] = {}
    runtime_values: dict[str, int | str] = {}
    for name, value in pairs.items():
        knob = sp.knob(name)
        v = knob.coerce(value)
        if knob.kind in COMPILE_KINDS:
            compile_values[knob.name] = int(v)
        else:
            runtime_values[knob.name] = v
    return compile_values, runtime_values


def set_pins(sp: SearchSpace, sets: Mapping[str, str]) -> tuple[dict[str, int], dict[str, int | str]]:
    """``--set`` pins checked against the space: ``variant`` one of its variants, the rest as :func:`set_values`."""
    if "variant" in sets and sets["variant"] not in sp.variants:
        raise UsageError(
            f"--set variant={sets['variant']} is not a variant of the {sp.arch} space; it has "
            f"{', '.join(sp.variants)}.{close_matches(sets['variant'], sp.variants)} Pin one of those, "
            "or leave variant unpinned."
        )
    return set_values(sp, {k: v for k, v in sets.items() if k != "variant"})


@dataclasses.dataclass(frozen=True, kw_only=True)
class RuntimeSettings:
    """What runtime knob values turn into: environment variables and llama-bench arguments."""

    env: Mapping[str, str]
    bench_args: tuple[str, ...]
    rules: tuple[FaRule, ...] = ()
    """The rule knobs' FlashAttention rules (``env`` holds them as GGML_TUNER_FA_RULES)."""


def render_runtime(sp: SearchSpace, values: Mapping[str, object]) -> RuntimeSettings:
    """Turn runtime knob values into env vars (``GGML_TUNER_FA_RULES``, ``GGML_TUNER_FA_T3``...) and bench args.

    Knobs at their upstream default set nothing, so the baseline runs with a clean environment.
    """
    checked = check_values(sp, values, section="runtime")
    env: dict[str, str] = {}
    args: list[str] = []
    rules: list[FaRule] = []
    for knob in sp.runtime_knobs:
        if knob.name not in checked:
            continue
        v = checked[knob.name]
        m = knob.meta
        if knob.kind == "rule":
            if v != "default":
                hi = m.get("hi")
                rules.append(
                    FaRule(phase=Phase(m["phase"]), lo=int(m["lo"]), hi=None if hi is None else int(hi), kernel=str(v))
                )
        elif knob.kind in ("threshold", "env") and v != knob.default:
            env[f"GGML_TUNER_FA_T{m['id']}" if knob.kind == "threshold" else str(m["env"])] = str(v)
        elif knob.kind == "bench_flag" and v != BENCH_DEFAULT:
            args += [str(m["flag"]), str(v)]
    if rules:
        env["GGML_TUNER_FA_RULES"] = rules_env(rules)
    return RuntimeSettings(env=env, bench_args=tuple(args), rules=tuple(rules))


# ----------------------------------------------- Table rows: upstream (parsed from a tree) and the space's own defaults


@functools.lru_cache(maxsize=16)
def _tables(
    path: str, mtime_ns: int, kind: str
) -> dict[str, dict[tuple[int, int, int], TileRow]] | dict[str, dict[tuple[int, int, int], MmaRow]]:
    text = Path(path).read_text()
    return parse_tile_tables(text) if kind == "tile_row" else parse_mma_tables(text)


def upstream_row(
    source_root: Path | None, kind: str, table: str, key: tuple[int, int, int], *, space: SearchSpace | None = None
) -> TileRow | MmaRow:
    """The tree's own row for (DKQ, DV, ncols) in a tile or MMA table; UsageError if it has no such table or row.
    Without a tree: the row ``space``'s defaults describe; UsageError unless it gives every field of a row it tunes."""
    if source_root is None:
        if space is None:
            raise UsageError("upstream_row needs a source tree or a search space.")
        fields: dict[str, int] = {}
        for k in space.compile_knobs:
            m = k.meta
            if k.kind == kind and m.get("table") == table and (m.get("dkq"), m.get("dv"), m.get("ncols")) == key:
                if k.default == "upstream":
                    raise UsageError(f"Knob {k.name!r} has default 'upstream'; pass the source tree to resolve it.")
                fields[str(m["field"])] = int(k.default)
        missing = [f for f in (_TILE_FIELDS if kind == "tile_row" else _MMA_FIELDS) if f not in fields]
        if missing:
            raise UsageError(
                f"{space.path}: {kind} {table} {key} has no knob for {', '.join(missing)}; give every field of a "
                f"tuned row (a fixed field is choices = [upstream value]) or pass the source tree."
            )
        return (TileRow if kind == "tile_row" else MmaRow)(dkq=key[0], dv=key[1], ncols=key[2], **fields)
    rel = "ggml/src/ggml-cuda/" + ("fattn-tile.cuh" if kind == "tile_row" else "fattn-mma-f16.cuh")
    path = Path(source_root) / rel
    if not path.is_file():
        raise UsageError(f"{path} does not exist: the tree has no {kind.split('_')[0]} kernel table (wrong era?).")
    tables = _tables(str(path), path.stat().st_mtime_ns, kind)
    if table not in tables:
        raise UsageError(f"{rel} has no table {table!r}.{close_matches(table, tables)} Tables: {', '.join(tables)}.")
    if key not in tables[table]:
        msg = f"{rel} table {table!r} has no row for (DKQ, DV, ncols) = {key}; only existing rows can be tuned."
        raise UsageError(msg)
    return tables[table][key]


def compile_values_of(space: SearchSpace, values: Mapping[str, Any]) -> dict[str, Any]:
    """The compile-time knob values that differ from upstream (what a build is keyed and patched by)."""
    return {k.name: values[k.name] for k in space.compile_knobs if k.name in values and values[k.name] != k.default}


def runtime_env_and_args(space: SearchSpace, values: Mapping[str, object]) -> tuple[dict[str, str], list[str]]:
    """Runtime knob values -> (env vars, llama-bench args); see :func:`render_runtime`."""
    names = {k.name for k in space.runtime_knobs}
    rt = render_runtime(space, {k: v for k, v in values.items() if k in names})
    return dict(rt.env), list(rt.bench_args)


def check_constraints(
    arch: str,
    era: str,
    compile_values: Mapping[str, int],
    model_shape: Mapping[str, int] | None = None,
    *,
    space: SearchSpace | None = None,
    source_root: Path | None = None,
) -> list[Violation]:
    """Every violation of a compile-time candidate of a search space, before any compile (empty: legal).

    Resolves the space's knobs into kernel-config rows (untuned fields from ``source_root``'s tables or the
    knobs' defaults) and hands them, as data, to :func:`tuner.plan.constraints.check_candidate`.
    ``model_shape`` (``{"head_dim", "head_dim_v", "gqa"}``) restricts WMMA checks to the model's D.
    """
    limits = load_arch_limits(arch)
    sp = space or load_space(arch, era)
    values = check_values(sp, compile_values, section="compile")
    groups: dict[tuple[str, str, tuple[int, int, int], int], dict[str, int]] = {}
    wmma: dict[str, int] = {}
    for knob in sp.compile_knobs:
        m = knob.meta
        if knob.kind == "wmma":
            wmma[str(m["field"])] = int(values.get(knob.name, knob.default))
            continue
        key = (int(m["dkq"]), int(m["dv"]), int(m["ncols"]))
        g = groups.setdefault((knob.kind, str(m["table"]), key, int(m.get("ncols2", 0))), {})
        if knob.name in values:
            g[str(m["field"])] = int(values[knob.name])
    rows: list[tuple[str, str, TileRow | MmaRow, int]] = []
    for (kind, table, key, ncols2), fields in groups.items():
        if not fields:
            continue
        base = upstream_row(source_root, kind, table, key, space=sp)  # without a tree: the space's defaults
        rows.append((kind, table, with_fields(base, fields), ncols2))
    return check_candidate(limits, rows, wmma=wmma, model_shape=model_shape)
