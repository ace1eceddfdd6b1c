"""One search run as its stages see it: :class:`SearchRun`, resolved once before the first stage, and the
records the stages hand on; each stage of :mod:`tuner.search.pipeline` is ``stage(run, previous) -> record``.
Here too: the run's builds, the test-backend-ops gate of a build and the measures.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tuner import log
from tuner._hash import stable_hash
from tuner.builder import cmake
from tuner.measure import gate as tbo
from tuner.plan import render
from tuner.plan.fa_rules import FaRule, Phase
from tuner.plan.space import SearchSpace
from tuner.plan.variant import Build
from tuner.rounds import live as live_bench
from tuner.rounds.budget import Budget, load_step_costs
from tuner.rounds.joint import Measure
from tuner.rounds.output_gate import GateCheck
from tuner.search.cost import full_build_seconds, nearest_recording
from tuner.search.device_guard import counted, device_checked
from tuner.search.kernel_screen import KernelMeasure
from tuner.search.study import SearchConfig
from tuner.study.record import StudyHeader, TunedTrial
from tuner.study.state import StudyState
from tuner.targets.models import ModelShape

if TYPE_CHECKING:
    import optuna

PHASES = ("tg", "pp")  # decode first: it is where the kernel choice matters most; phases never gate each other
ALL_KERNELS = ("VEC", "TILE", "MMA")
"""The FlashAttention kernels a gate forces (as test-backend-ops names them)."""

MeasureFactory = Callable[[Build], Measure]


class Equivalence(Protocol):
    """Replaces the output gate's llama-perplexity runs (:func:`tuner.rounds.output_gate.run_gate_check`)."""

    def __call__(self, check: GateCheck, upstream: Build, final: Build, work_dir: Path, /) -> Mapping[str, object]: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class GateResult:
    """test-backend-ops FLASH_ATTN_EXT on one build with ``kernels`` forced: ``pass``, ``fail`` or ``skipped``."""

    status: str
    why: str = ""
    summary: str = ""
    failing: tuple[str, ...] = ()
    log: str = ""
    kernels: tuple[str, ...] = ()

    def stored(self) -> dict[str, object]:
        if self.status == "skipped":
            return {"status": self.status, "why": self.why}
        return {
            "status": self.status,
            "summary": self.summary,
            "failing": list(self.failing),
            "log": self.log,
            "kernels": list(self.kernels),
        }

    @classmethod
    def from_stored(cls, rec: Mapping[str, Any]) -> GateResult:
        return cls(
            status=str(rec["status"]),
            why=str(rec.get("why") or ""),
            summary=str(rec.get("summary") or ""),
            failing=tuple(rec.get("failing") or ()),
            log=str(rec.get("log") or ""),
            kernels=tuple(rec.get("kernels") or ()),
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Proposal:
    """What the confirm measures against upstream: the composed rules and the tune's trial (None: upstream's knobs)."""

    rules: tuple[FaRule, ...]
    tuned: TunedTrial | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class SearchRun:
    """Everything the stages of one search (or ``tuner worker``) share, resolved once."""

    cfg: SearchConfig
    study: optuna.Study
    storage: optuna.storages.RDBStorage
    st: StudyState
    header: StudyHeader
    space: SearchSpace
    """The space with this machine's threads/-ngl values."""
    variants: tuple[str, ...]
    """The variants searched, upstream's first."""
    fixed: Mapping[str, object]
    shape: ModelShape
    base_env: Mapping[str, str]
    base_args: tuple[str, ...]
    """Upstream's runtime: the pinned runtime knobs' env and llama-bench arguments (with ``host_args``)."""
    host_args: tuple[str, ...] = ()
    """What every config runs with because of this host (:func:`tuner.search.pipeline.repack_probe`)."""
    builds: Builds
    budget: Budget
    factory: MeasureFactory
    """The measure of a build: llama-bench's (or ``custom``), counted in the study and held to its device."""
    custom: MeasureFactory | None = None
    """The measure that replaces llama-bench (a test's, the replay's); None: the live one."""
    equivalence: Equivalence | None = None

    @property
    def base_variant(self) -> str:
        return str(self.fixed.get("variant", self.variants[0]))

    @property
    def kernels(self) -> dict[str, list[str]]:
        return {p: kernels_for(self.space, p) for p in PHASES}

    def price(self, key: str) -> float:
        """A per-step cost (``tuner/data/step_costs.toml``) recorded for the model size nearest this one."""
        return float(nearest_recording(load_step_costs(), self.shape.d_model)[key])


def kernels_for(space: SearchSpace, phase: str) -> list[str]:
    """Forced kernels the space allows for a phase (its rule knobs' choices; none on the CPU)."""
    want = Phase.from_bench(phase).value
    rules = [k for k in space.runtime_knobs if k.kind == "rule" and k.meta.get("phase") == want]
    return list(dict.fromkeys(str(c) for k in rules for c in (k.choices or ()) if c != "default"))


class Builds:
    """The builds of one process, looked up once per (variant, compile values): a cached build still costs a
    render and a no-op ninja run. Compile values come checked (tune trials). A build that is not cached starts
    only where its price fits the ``budget``."""

    def __init__(self, cfg: SearchConfig, space: SearchSpace | None, budget: Budget) -> None:
        self.cfg, self.space, self.budget = cfg, space, budget
        self._known: dict[str, Build] = {}
        self.targets = cmake.search_targets(cfg.target.is_cpu)

    def get(self, variant: str, compile_values: Mapping[str, Any]) -> Build:
        key = stable_hash(variant, dict(compile_values))
        if key not in self._known:
            rv = render.render_variant(
                self.cfg.source,
                self.cfg.arch,
                variant,
                compile_values=compile_values,
                local_archs=list(self.cfg.target.local_archs),
                space=self.space,
                checked=True,
            )
            if not cmake.is_built(rv, self.targets):
                self.budget.fits(full_build_seconds(), f"the build of {rv.short}")
            self._known[key] = cmake.build_variant(rv, targets=self.targets, jobs=self.cfg.jobs)
        return self._known[key]


def gate(run: SearchRun, build: Build, kernels: Sequence[str] = ALL_KERNELS) -> GateResult:
    """test-backend-ops FLASH_ATTN_EXT with each of ``kernels`` forced, once per build (recorded in the study);
    started only where its price fits the budget."""
    st, cfg, arch = run.st, run.cfg, run.cfg.target.arch
    gates = st.gates
    if build.build_id in gates:
        return GateResult.from_stored(gates[build.build_id])
    if not cfg.gate or arch.vendor == "cpu":
        res = GateResult(
            status="skipped",
            why="CPU backend is the reference test-backend-ops compares against"
            if arch.vendor == "cpu"
            else "--no-gate",
        )
    else:
        run.budget.fits(
            run.price("gate_s") * len(kernels) / len(ALL_KERNELS), f"the test-backend-ops gate of {build.build_id}"
        )
        t0 = time.monotonic()
        which = "each kernel" if len(kernels) == len(ALL_KERNELS) else "/".join(kernels)
        with log.step(f"Gate: test-backend-ops FLASH_ATTN_EXT with {which} forced (head size {run.shape.head_dim})"):
            g = tbo.run_gate(
                build.bin_dir,
                kernels=list(kernels),
                backend=f"{arch.backend}0",
                params=tbo.params_for_model(run.shape.head_dim, "f16"),
                log_dir=cfg.run_dir / "logs",
            )
        st.add_seconds("gate", time.monotonic() - t0)
        res = GateResult(
            status="pass" if g.passed else "fail",
            summary=g.summary,
            failing=tuple(g.failing)[:20],
            log=str(g.log_file),
            kernels=tuple(kernels),
        )
    gates[build.build_id] = res.stored()
    st.set_gates(gates)
    if not st.has_toolchain():
        st.set_toolchain(dict(build.meta.get("toolchain", {})))
    return res


def kv_type(bench_args: Sequence[str]) -> str:
    """The K-cache type the runs use: llama-bench's -ctk when a pinned knob sets it, else its f16 default."""
    args = list(bench_args)
    return str(args[args.index("-ctk") + 1]) if "-ctk" in args[:-1] else "f16"


def live_measure(cfg: SearchConfig, build: Build) -> Measure:
    """The real llama-bench of ``build`` with ``cfg``'s tokens and repetitions."""
    return live_bench.make_live_measure(
        build.bin_dir,
        cfg.model,
        pp=cfg.pp,
        tg=cfg.tg,
        reps={"pp": cfg.reps_pp, "tg": cfg.reps_tg},
        log_dir=cfg.run_dir / "logs",
        era=cfg.source.era,
        arch=cfg.arch,
        cpus=cfg.cpu_mask,
    )


def kernel_factory(run: SearchRun) -> MeasureFactory:
    """build -> the op-level measure (FLASH_ATTN_EXT at the model's shape), held to the study's device."""
    cfg = run.cfg

    def make(b: Build) -> Measure:
        return KernelMeasure(
            b.bin_dir,
            run.header.shape,
            pp=cfg.pp,
            tg=cfg.tg,
            kv_type=kv_type(run.base_args),
            bench_args=run.base_args,
            log_dir=cfg.run_dir / "logs" / "kernel-screen",
        )

    return device_checked(run.st, make)


def confirm_factory(run: SearchRun, proposal: Proposal) -> MeasureFactory:
    """The confirm stage's measure factory. Prefill that rides along in shared calls only to show it did not
    move gets decode's repetitions (a call's -r is the larger of its phases')."""
    if run.custom is not None or proposal.tuned or any(r.phase is Phase.PREFILL for r in proposal.rules):
        return run.factory
    ride = dataclasses.replace(run.cfg, reps_pp=min(run.cfg.reps_pp, run.cfg.reps_tg))
    return counted(run.st, device_checked(run.st, lambda b: live_measure(ride, b)))
