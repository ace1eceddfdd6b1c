"""Every Optuna user attribute a ``tuner search`` study holds, by name, in one place: :class:`StudyState`
is the only code that reads or writes them (a getter and setter per key, each key family spelled once).

The stored JSON is what earlier tuner versions wrote (``results/*/evidence/study.db.xz`` load unchanged);
rules are :class:`tuner.plan.fa_rules.FaRule` in memory and their text in the study (:func:`tuner.plan.fa_rules.as_stored`).
Optuna's samplers keep their study keys the same way (``optuna/samplers/_tpe/sampler.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from tuner.errors import UsageError
from tuner.plan.fa_rules import as_stored

if TYPE_CHECKING:
    from optuna.storages import BaseStorage


class UserAttrs(Protocol):
    """An Optuna study or trial: its user attributes are unchecked JSON, as Optuna stores them."""

    @property
    def user_attrs(self) -> dict[str, object]: ...

    def set_user_attr(self, key: str, value: object) -> None: ...


# -- study attributes -------------------------------------------------------------------------------
# the header: what the study measured (written once, when a search first opens the study)
PIPELINE = "pipeline"
ARCH = "arch"
SOURCE_SPEC = "source_spec"
SOURCE_ID = "source_id"
COMMIT = "commit"
ERA = "era"
MODEL = "model"
DEPTHS = "depths"
PP = "pp"
TG = "tg"
SHAPE = "shape"
PROFILE = "profile"
CPU_MASK = "cpu_mask"
HEADER_KEYS = (PIPELINE, ARCH, SOURCE_SPEC, SOURCE_ID, COMMIT, ERA, MODEL, DEPTHS, PP, TG, SHAPE, PROFILE, CPU_MASK)
"""The keys a search records on first opening a study (in this order)."""
RESUME_CHECKED = (ARCH, SOURCE_ID, DEPTHS, PP, TG, CPU_MASK)
"""Header keys a resumed search must match: its numbers would not be comparable otherwise."""
DERIVED_KNOBS = "derived_knobs"  # threads/-ngl legal values on the search's machine (the export resolves them)
DEVICE = "device"  # the device llama-bench reported
TOOLCHAIN = "toolchain"  # the first build's compilers
SEEDED_FROM = "seeded_from"  # read only: seeded from another's rounds (results/sm_90/llama-3.2-1b-q4_k_m/evidence/)

# the stages' records
GATES = "gates"  # test-backend-ops per build id
STAGE_SECONDS = "stage_seconds"
HOST_ARGS = "host_args"
LLAMA_BENCH_CALLS = "llama_bench_calls"  # llama-bench runs the search made (summed over resumed runs)
SCREEN_ROUNDS = "screen_rounds"
SCREEN_METHOD = "screen_method"  # what timed the screen: "kernel" (the FA op alone) or "llama-bench"
TUNE_METHOD = "tune_method"  # what timed the tune's trials: "kernel" (the FA op alone) or "llama-bench"
TUNE_FOCUS = "tune_focus"  # the tune's --tune-knobs globs and --tune-depths: what its trials sampled and measured
COMPOSE = "compose"
RESULT = "result"  # the search's outcome (tuner.study.record.SearchOutcome)

PHASES = ("tg", "pp")


def _phase(phase: str) -> str:
    if phase not in PHASES:
        raise ValueError(f"phase {phase!r} is not one of {PHASES}")
    return phase


# The key families, one function each: the only places their f-strings are spelled.
def screen_done_key(phase: str) -> str:
    return f"screen_done_{_phase(phase)}"


def refined_key(phase: str) -> str:
    return f"refined_{_phase(phase)}"


def screen_key(phase: str) -> str:
    return f"screen_{_phase(phase)}"


def confirm_rounds_key(ckey: str) -> str:
    return f"confirm_rounds_{ckey}"


def confirm_done_key(ckey: str, phase: str) -> str:
    return f"confirm_done_{ckey}_{_phase(phase)}"


def residency_key(ckey: str) -> str:
    return f"residency_{ckey}"


def equivalence_key(ckey: str) -> str:
    return f"equivalence_{ckey}"


class TuneFocus(TypedDict):
    knobs: list[str]
    depths: list[int]


class StudyState:
    """The study's user attributes as the pipeline's resumable state (``study``: an Optuna study, or
    anything with ``user_attrs`` and ``set_user_attr``)."""

    def __init__(self, study: UserAttrs) -> None:
        self.study = study

    # -- raw access, for this class only ---------------------------------------------------------
    def _get(self, key: str, default: object = None) -> Any:
        return self.study.user_attrs.get(key, default)

    def _set(self, key: str, value: object) -> None:
        # FaRules (a result's rules, its rule-keyed ``dropped``) as their text: the list[str] studies hold
        self.study.set_user_attr(key, as_stored(value))

    def _append(self, key: str, rec: Mapping[str, object]) -> None:
        self._set(key, [*self._get(key, []), dict(rec)])

    @property
    def attrs(self) -> Mapping[str, object]:
        """Every stored attribute (read only): what :mod:`tuner.study.record` builds its records from."""
        return dict(self.study.user_attrs)

    # -- header ----------------------------------------------------------------------------------
    def header_value(self, key: str, default: object = None) -> object:
        if key not in HEADER_KEYS:
            raise KeyError(f"{key!r} is not a header key ({HEADER_KEYS})")
        return self._get(key, default)

    def record_header(self, values: Mapping[str, object]) -> None:
        """Write each header value the study does not hold yet (a study seeded from another one lacks
        some, e.g. the model); values already there stay."""
        unknown = set(values) - set(HEADER_KEYS)
        if unknown:
            raise KeyError(f"{sorted(unknown)} are not header keys ({HEADER_KEYS})")
        for k, v in values.items():
            if self._get(k) is None:
                self._set(k, v)

    @property
    def pipeline(self) -> int | None:
        """The pipeline version that made the study (None: the older one-TPE search made it)."""
        version: int | None = self._get(PIPELINE)
        return version

    @property
    def arch(self) -> str | None:
        arch: str | None = self._get(ARCH)
        return arch

    @property
    def derived_knobs(self) -> dict[str, object]:
        return dict(self._get(DERIVED_KNOBS, {}))

    def set_derived_knobs(self, knobs: Mapping[str, object]) -> None:
        self._set(DERIVED_KNOBS, dict(knobs))

    @property
    def device(self) -> str | None:
        device: str | None = self._get(DEVICE)
        return device

    def set_device(self, device: str) -> None:
        self._set(DEVICE, device)

    def has_toolchain(self) -> bool:
        return TOOLCHAIN in self.study.user_attrs

    def set_toolchain(self, toolchain: Mapping[str, object]) -> None:
        self._set(TOOLCHAIN, dict(toolchain))

    # -- stage records ---------------------------------------------------------------------------
    @property
    def host_args(self) -> list[str] | None:
        """llama-bench arguments every config of this study runs with because of the host (``--repack 0``
        where llama.cpp's AMX kernels die here); None: not probed yet."""
        got = self._get(HOST_ARGS)
        if got is None:
            return None
        if got not in ([], ["--repack", "0"]):  # what repack_probe writes; anything else reaches llama-bench's argv
            raise UsageError(
                f"the study's {HOST_ARGS} is {got!r}, which tuner never writes: an edited or foreign study."
            )
        return list(got)

    def set_host_args(self, args: list[str]) -> None:
        self._set(HOST_ARGS, list(args))

    @property
    def gates(self) -> dict[str, Any]:
        """test-backend-ops records per build id."""
        return dict(self._get(GATES, {}))

    def set_gates(self, gates: Mapping[str, object]) -> None:
        self._set(GATES, dict(gates))

    @property
    def stage_seconds(self) -> dict[str, float]:
        return dict(self._get(STAGE_SECONDS, {}))

    def add_seconds(self, stage: str, secs: float) -> None:
        s = self.stage_seconds
        s[stage] = round(s.get(stage, 0.0) + secs, 1)
        self._set(STAGE_SECONDS, s)

    @property
    def llama_bench_calls(self) -> int | None:
        """llama-bench runs made so far (None: the study predates the count)."""
        n = self._get(LLAMA_BENCH_CALLS)
        return None if n is None else int(n)

    def add_llama_bench_calls(self, n: int = 1) -> None:
        self._set(LLAMA_BENCH_CALLS, (self.llama_bench_calls or 0) + n)

    @property
    def screen_method(self) -> str | None:
        """What timed the screen's rounds (None: not recorded; studies before the kernel-level screen)."""
        v = self._get(SCREEN_METHOD)
        return None if v is None else str(v)

    def set_screen_method(self, method: str) -> None:
        self._set(SCREEN_METHOD, method)

    @property
    def tune_method(self) -> str | None:
        """What timed the tune's trials (None: not recorded; studies before op-level trials used llama-bench)."""
        v = self._get(TUNE_METHOD)
        return None if v is None else str(v)

    def set_tune_method(self, method: str) -> None:
        self._set(TUNE_METHOD, method)

    @property
    def tune_focus(self) -> TuneFocus | None:
        """``{"knobs": globs, "depths": depths}`` the tune's trials were asked with (None: not recorded)."""
        v = self._get(TUNE_FOCUS)
        return None if v is None else {"knobs": list(v.get("knobs", [])), "depths": list(v.get("depths", []))}

    def set_tune_focus(self, knobs: Sequence[str], depths: Sequence[int]) -> None:
        self._set(TUNE_FOCUS, {"knobs": list(knobs), "depths": [int(d) for d in depths]})

    @property
    def screen_rounds(self) -> list[dict[str, Any]]:
        return list(self._get(SCREEN_ROUNDS, []))

    def append_screen_round(self, rec: Mapping[str, object]) -> None:
        self._append(SCREEN_ROUNDS, rec)

    def screen_done(self, phase: str) -> bool:
        return bool(self._get(screen_done_key(phase)))

    def set_screen_done(self, phase: str, done: bool) -> None:
        self._set(screen_done_key(phase), done)

    def refined(self, phase: str) -> list[int]:
        """Depths the screen of ``phase`` added at kernel boundaries."""
        return list(self._get(refined_key(phase), []))

    def set_refined(self, phase: str, depths: Sequence[int]) -> None:
        self._set(refined_key(phase), list(depths))

    def screen(self, phase: str) -> dict[str, Any]:
        """The judged screen cells of ``phase`` by depth (as text)."""
        return dict(self._get(screen_key(phase), {}))

    def set_screen(self, phase: str, cells: Mapping[str, object]) -> None:
        self._set(screen_key(phase), dict(cells))

    @property
    def compose(self) -> dict[str, Any]:
        """The composed rules, the decisions they came from and the shape key (empty before compose)."""
        return dict(self._get(COMPOSE) or {})

    def set_compose(self, rec: Mapping[str, object]) -> None:
        self._set(COMPOSE, dict(rec))

    def confirm_rounds(self, ckey: str) -> list[dict[str, object]]:
        return list(self._get(confirm_rounds_key(ckey), []))

    def append_confirm_round(self, ckey: str, rec: Mapping[str, object]) -> None:
        self._append(confirm_rounds_key(ckey), rec)

    def confirm_done(self, ckey: str, phase: str) -> bool:
        return bool(self._get(confirm_done_key(ckey, phase)))

    def set_confirm_done(self, ckey: str, phase: str) -> None:
        self._set(confirm_done_key(ckey, phase), True)

    def set_confirm(self, ckey: str, rec: Mapping[str, object]) -> None:
        self._set(f"confirm_{ckey}", dict(rec))

    def residency(self, ckey: str) -> dict[str, Any] | None:
        rec = self._get(residency_key(ckey))
        return None if rec is None else dict(rec)

    def set_residency(self, ckey: str, rec: Mapping[str, object]) -> None:
        self._set(residency_key(ckey), dict(rec))

    def equivalence_checks(self, ckey: str) -> dict[str, object]:
        """The output-equivalence gate's finished checks for the final config ``ckey``, by name."""
        return dict((self._get(equivalence_key(ckey)) or {}).get("checks", {}))

    def set_equivalence_check(self, ckey: str, name: str, rec: Mapping[str, object]) -> None:
        self._set(equivalence_key(ckey), {"checks": {**self.equivalence_checks(ckey), name: dict(rec)}})

    def result(self) -> dict[str, object] | None:
        """The stored outcome as its JSON (None before the search finished); :func:`tuner.study.record.load_outcome`
        is its typed view."""
        res = self._get(RESULT)
        return dict(res) if res else None

    def set_result(self, result: Mapping[str, object]) -> None:
        self._set(RESULT, dict(result))


# -- trial attributes -------------------------------------------------------------------------------
TRIAL_KEYS = (
    "worker",  # host:pid of the process running the trial (a dead one's trial is failed and run again)
    "values",  # every knob's value (pinned ones included)
    "phases",  # the phases the trial measured
    "status",  # ok | infeasible | failed | interrupted
    "reason",  # why it failed
    "ratios",  # per-point candidate/reference ratios
    "cpu",  # per-point CPU% record
    "rejected",  # why the CPU cost rejected it
    "retry_of",  # the number of the interrupted trial it repeats
)
"""Attributes a tune trial holds."""


def _trial_key(key: str) -> str:
    if key not in TRIAL_KEYS:
        raise KeyError(f"{key!r} is not a trial attribute ({TRIAL_KEYS})")
    return key


def write_trial(trial: UserAttrs, **attrs: object) -> None:
    """Set trial attributes (each of :data:`TRIAL_KEYS`)."""
    for k, v in attrs.items():
        trial.set_user_attr(_trial_key(k), v)


def trial_attr(trial: object, key: str, default: object = None) -> Any:
    """One attribute of a trial (a FrozenTrial, a live Trial or any object with ``user_attrs``)."""
    return (getattr(trial, "user_attrs", None) or {}).get(_trial_key(key), default)


def write_trial_in_storage(storage: BaseStorage, trial_id: int, **attrs: object) -> None:
    """Set attributes of a trial this process may not hold (one cut off by an interruption, or another
    process's stale trial) through the storage."""
    for k, v in attrs.items():
        storage.set_trial_user_attr(trial_id, _trial_key(k), v)


def retry_attrs(number: int) -> dict[str, int]:
    """The attributes of a queued retry of trial ``number`` (``enqueue_trial(user_attrs=...)``)."""
    return {_trial_key("retry_of"): number}
