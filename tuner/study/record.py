"""The typed record of a finished ``tuner search``: :class:`StudyHeader` (what was measured, on what) and
:class:`SearchOutcome` (what it concluded), built from the study alone by :func:`load_outcome`.

The search writes the outcome through :class:`tuner.study.state.StudyState` (the JSON earlier versions stored);
the export reads it back here. Like cibuildwheel's resolved options, everything downstream works from one frozen value.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from tuner.errors import TunerError
from tuner.measure.paired import UPSTREAM_KEPT
from tuner.plan.fa_rules import FaRule, as_stored, rules_from_texts, rules_texts
from tuner.study import state as k
from tuner.study.state import StudyState

if TYPE_CHECKING:
    from optuna import Study
    from optuna.trial import FrozenTrial

_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True, kw_only=True)
class StudyHeader:
    """What the study measured and where. Old studies may lack any field (a study seeded from another
    one had no model): each is None or empty then, as the stored attribute was absent."""

    name: str
    pipeline: int | None = None
    arch: str | None = None
    model: str | None = None
    shape: Mapping[str, int] = dataclasses.field(default_factory=dict)
    depths: tuple[int, ...] = ()
    pp: int | None = None
    tg: int | None = None
    source_spec: str | None = None
    source_id: str | None = None
    commit: str | None = None
    era: str | None = None
    profile: str | None = None
    cpu_mask: tuple[int, ...] | None = None
    """CPUs llama-bench was pinned to (empty or None: not pinned)."""
    device: str | None = None
    """The device llama-bench reported."""
    toolchain: Mapping[str, str] = dataclasses.field(default_factory=dict)
    derived_knobs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """threads/-ngl legal values on the search's machine (:func:`tuner.plan.derive.resolve_space` takes them)."""
    seeded_from: str | None = None

    def required(self, value: _T | None, key: str) -> _T:
        """``value``, this header's field ``key``, when the study recorded it; TunerError otherwise."""
        if value is None:
            raise TunerError(
                f"Study {self.name!r} has no {key} in its header (an older tuner made it, or its search never "
                "started): it cannot be exported."
            )
        return value

    @classmethod
    def from_attrs(cls, name: str, a: Mapping[str, Any]) -> StudyHeader:
        mask = a.get(k.CPU_MASK)
        # each header key is a field of the same name (as stored() reads them)
        plain = {key: a.get(key) for key in k.HEADER_KEYS if key not in (k.SHAPE, k.DEPTHS, k.CPU_MASK)}
        return cls(
            name=name,
            **plain,
            shape=dict(a.get(k.SHAPE) or {}),
            depths=tuple(a.get(k.DEPTHS) or ()),
            cpu_mask=None if mask is None else tuple(mask),
            device=a.get(k.DEVICE),
            toolchain=dict(a.get(k.TOOLCHAIN) or {}),
            derived_knobs=dict(a.get(k.DERIVED_KNOBS) or {}),
            seeded_from=a.get(k.SEEDED_FROM),
        )

    def stored(self) -> dict[str, object]:
        """The header's attributes as a search records them on first opening the study (every key of
        :data:`tuner.study.state.HEADER_KEYS`, in its order)."""
        plain = {key: getattr(self, key) for key in k.HEADER_KEYS}  # each header key is a field of the same name
        mask = None if self.cpu_mask is None else list(self.cpu_mask)
        return plain | {k.DEPTHS: list(self.depths), k.SHAPE: dict(self.shape), k.CPU_MASK: mask}


@dataclasses.dataclass(frozen=True, kw_only=True)
class TunedTrial:
    """The tune trial the confirm kept: its number, every knob's value and the sampled ones."""

    trial: int
    values: Mapping[str, object]
    params: Mapping[str, object]

    def stored(self) -> dict[str, object]:
        return {"trial": self.trial, "values": dict(self.values), "params": dict(self.params)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrialSummary:
    """One tune trial as the report lists it."""

    number: int
    status: str
    """Its recorded status, else its Optuna state (lower case)."""
    objectives: tuple[float, ...]
    params: Mapping[str, object]
    phases: tuple[str, ...]
    reason: str | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class SearchOutcome:
    """What a finished search concluded, with the stage records the export reports."""

    header: StudyHeader
    rules: tuple[FaRule, ...] = ()
    """The confirmed FlashAttention rules (upstream's selection elsewhere)."""
    dropped: Mapping[FaRule, str] = dataclasses.field(default_factory=dict)
    """Composed rules the confirm (or a gate) dropped, with why."""
    narrowed: Mapping[FaRule, str] = dataclasses.field(default_factory=dict)
    """Exported rules the confirm narrowed (:func:`tuner.search.confirm.judge`), each with the rule it was and
    why: a lower bound raised to the first depth it confirmed faster at (empty in a study before narrowing)."""
    tuned: TunedTrial | None = None
    """The confirmed tune trial; None: process-wide and compile-time knobs stay upstream's."""
    rows: tuple[Mapping[str, Any], ...] = ()
    """The confirmed points: final config vs upstream per (phase, depth), as the confirm judged them."""
    attempt: int | None = None
    knobs_dropped: Mapping[str, Any] | None = None
    """The tune trial the confirm measured against upstream and then dropped (``trial``, ``params``, ``why``,
    ``phases``, its ``rows``); None: none was dropped."""
    upstream_phases: tuple[str, ...] = ()
    """Phases left as upstream and not measured again."""
    confirm_depths: tuple[int, ...] | None = None
    gate: Mapping[str, Any] | None = None
    """The output-equivalence gate's record (None: the study finished before the gate existed)."""
    residency: Mapping[str, object] | None = None
    """The residency gate's record (None: not recorded)."""
    op_checks: Mapping[str, Mapping[str, object]] = dataclasses.field(default_factory=dict)
    """test-backend-ops FLASH_ATTN_EXT per build id."""
    screens: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    """The judged screen cells per phase (``tg``, ``pp``) and depth (as text)."""
    screen_method: str = "llama-bench"
    """What timed the screen: ``kernel`` (test-backend-ops FLASH_ATTN_EXT alone) or ``llama-bench``."""
    tune_method: str = "llama-bench"
    """What timed the tune's trials, as ``screen_method``."""
    compose: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    stage_seconds: Mapping[str, float] = dataclasses.field(default_factory=dict)
    llama_bench_calls: int | None = None
    """llama-bench runs the search made, resumed runs summed (None: the study predates the count)."""
    trials: tuple[TrialSummary, ...] = ()
    stored_keys: frozenset[str] = dataclasses.field(default=frozenset(), compare=False, repr=False)
    """The keys of the stored result it was read from: an optional one it held empty is written back
    (the confirm stores ``narrowed: {}``, results exported before narrowing have no such key)."""

    @property
    def cost(self) -> dict[str, float | int]:
        """The search's cost (config.toml's ``[cost]``): seconds per stage, llama-bench calls, tune trials; a
        field the study did not measure is absent, never 0. ``gates_s``: residency and output-equivalence
        together; ``build_s``: the upstream build (the tune's builds are in ``tune_s``)."""
        secs = self.stage_seconds
        stages = ("build", "model", "gate", "screen", "tune", "confirm")
        out: dict[str, float | int] = {f"{f}_s": round(float(secs[f]), 1) for f in stages if f in secs}
        if "residency" in secs or "equivalence" in secs:
            out["gates_s"] = round(float(secs.get("residency", 0.0)) + float(secs.get("equivalence", 0.0)), 1)
        if "total" in secs:
            out["total_s"] = round(float(secs["total"]), 1)
        if self.llama_bench_calls is not None:
            out["llama_bench_calls"] = int(self.llama_bench_calls)
        # the study holds every trial, a worker's and a resumed run's; one cut off was asked again, so it
        # is not counted (tuner.search.tune.INTERRUPTED)
        out["tune_trials"] = sum(t.status != "interrupted" for t in self.trials)
        return out

    @property
    def rule_texts(self) -> list[str]:
        """The rules as GGML_TUNER_FA_RULES entries."""
        return rules_texts(self.rules)

    @classmethod
    def from_result(cls, header: StudyHeader, res: Mapping[str, Any], **rest: Any) -> SearchOutcome:
        """The outcome of a stored ``result`` (its JSON as :meth:`result_json` writes it)."""
        tuned = res.get("tuned")
        cd = res.get("confirm_depths")
        return cls(
            header=header,
            rules=rules_from_texts(res.get("rules") or ()),
            dropped=_rule_reasons(res.get("dropped")),
            narrowed=_rule_reasons(res.get("narrowed")),
            tuned=TunedTrial(
                trial=int(tuned["trial"]),
                values=dict(tuned.get("values") or {}),
                params=dict(tuned.get("params") or {}),
            )
            if tuned
            else None,
            rows=tuple(dict(r) for r in res.get("rows") or ()),
            attempt=res.get("attempt"),
            knobs_dropped=None if res.get("knobs_dropped") is None else dict(res["knobs_dropped"]),
            upstream_phases=tuple(res.get("upstream_phases") or ()),
            confirm_depths=None if cd is None else tuple(int(d) for d in cd),
            gate=None if res.get("gate") is None else dict(res["gate"]),
            residency=None if res.get("residency") is None else dict(res["residency"]),
            stored_keys=frozenset(res),
            **rest,
        )

    def exported(self) -> SearchOutcome:
        """The outcome as an export shows it: a dropped rule's points relabelled as upstream's where the
        rules were confirmed alone (the export runs upstream's config there; :func:`relabel_rows`). The
        confirm does this itself now; studies recorded before it did keep their rows as they were."""
        if self.tuned:
            return self
        return dataclasses.replace(self, rows=tuple(relabel_rows(self.rows, self.rules, list(self.dropped))))

    def result_json(self) -> dict[str, object]:
        """The stored ``result`` attribute: the layout every tuner version since the pipeline wrote."""
        out: dict[str, object] = {"rules": rules_texts(self.rules), "dropped": as_stored(dict(self.dropped))}
        if self.narrowed or "narrowed" in self.stored_keys:  # after dropped, as the confirm stores it; results
            out["narrowed"] = as_stored(dict(self.narrowed))  # from before narrowing keep their layout
        out["tuned"] = self.tuned.stored() if self.tuned else None
        out["rows"] = [dict(r) for r in self.rows]
        if self.attempt is not None:
            out["attempt"] = self.attempt
        out["upstream_phases"] = list(self.upstream_phases)
        if self.confirm_depths is not None:
            out["confirm_depths"] = list(self.confirm_depths)
        if self.knobs_dropped is not None:  # only where the confirm dropped knobs, after what it always writes
            out["knobs_dropped"] = dict(self.knobs_dropped)
        if self.residency is not None:  # the residency gate runs before the output-equivalence gate
            out["residency"] = dict(self.residency)
        if self.gate is not None:
            out["gate"] = dict(self.gate)
        return out


def _rule_reasons(stored: Mapping[str, object] | None) -> dict[FaRule, str]:
    """A stored ``{rule text: why}`` as rules."""
    return {r: str(why) for text, why in dict(stored or {}).items() for r in rules_from_texts([text])}


def outcome_from_attrs(a: Mapping[str, Any], *, name: str = "", trials: Iterable[FrozenTrial] = ()) -> SearchOutcome:
    """The outcome of a study whose attributes are ``a`` (its ``result`` may be missing: an empty outcome)."""
    return SearchOutcome.from_result(
        StudyHeader.from_attrs(name, a),
        a.get(k.RESULT) or {},
        op_checks=dict(a.get(k.GATES) or {}),
        screens={p: dict(a.get(k.screen_key(p)) or {}) for p in k.PHASES},
        screen_method=str(a.get(k.SCREEN_METHOD) or "llama-bench"),
        tune_method=str(a.get(k.TUNE_METHOD) or "llama-bench"),
        compose=dict(a.get(k.COMPOSE) or {}),
        stage_seconds=dict(a.get(k.STAGE_SECONDS) or {}),
        llama_bench_calls=None if a.get(k.LLAMA_BENCH_CALLS) is None else int(a[k.LLAMA_BENCH_CALLS]),
        trials=tuple(
            TrialSummary(
                number=t.number,
                status=str(k.trial_attr(t, "status") or t.state.name.lower()),
                objectives=tuple(t.values or ()),
                params=dict(t.params),
                phases=tuple(k.trial_attr(t, "phases", []) or ()),
                reason=k.trial_attr(t, "reason"),
            )
            for t in trials
        ),
    )


def load_outcome(study: Study) -> SearchOutcome:
    """The finished search's record, from ``study`` alone; TunerError before its confirm stage finished."""
    st = StudyState(study)
    if st.result() is None:
        raise TunerError(
            f"study {study.study_name!r} has not finished its confirm stage yet; rerun the same `tuner search` "
            "command to resume it, then export."
        )
    return outcome_from_attrs(st.attrs, name=study.study_name, trials=study.get_trials(deepcopy=False))


_MEASURED = (
    "kernel",
    "verdict",
    "tuned_ts",
    "speedup",
    "ci_low",
    "ci_high",
    "tuned_cpu",
    "cpu_delta",
    "cpu_ci_low",
    "cpu_ci_high",
    "tuned_core",
    "tuned_gpu",
)
"""A relabelled point's own measurements of the forced kernel, kept as ``measured_<key>``."""


def relabel_rows(
    rows: Sequence[Mapping[str, Any]], kept: Sequence[FaRule], narrowed_from: Sequence[FaRule]
) -> list[dict[str, object]]:
    """``rows`` with each point that a rule of ``narrowed_from`` (before narrowing) covered and no rule of
    ``kept`` covers any more relabelled as upstream's (the export runs upstream's config there): its kernel,
    verdict :data:`UPSTREAM_KEPT`, t/s and CPU/GPU% upstream's (speedup 1, no CI), what the forced kernel measured
    kept as ``measured_<key>``. A point relabelled before is left as it is; the confirm relabels itself now
    (``tuner.search.confirm.judge``), :meth:`SearchOutcome.exported` does it for older studies."""
    out = []
    for x in rows:
        d, ph = int(x["depth"]), x["phase"]
        was = any(r.phase.bench == ph and r.covers(d) for r in narrowed_from)
        if not was or "measured_kernel" in x or any(r.phase.bench == ph and r.covers(d) for r in kept):
            out.append(dict(x))
            continue
        nan = math.nan
        out.append(
            {
                **x,
                **{f"measured_{k}": x[k] for k in _MEASURED if k in x},
                "kernel": x.get("upstream_kernel"),
                "verdict": UPSTREAM_KEPT,
                "tuned_ts": x.get("base_ts", nan),
                "speedup": 1.0,
                "ci_low": nan,
                "ci_high": nan,
                **{k: nan for k in ("cpu_delta", "cpu_ci_low", "cpu_ci_high") if k in x},
                **{f"tuned_{k}": x[f"base_{k}"] for k in ("cpu", "core", "gpu") if f"base_{k}" in x},
            }
        )
    return out
