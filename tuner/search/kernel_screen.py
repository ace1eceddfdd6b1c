"""The kernel-level screen measure: ``FLASH_ATTN_EXT`` alone at the model's shape, one case per depth.

A llama-bench screen call pays a context fill per depth (docs/llama-bench-cost.md); the kernel choice is a
property of the attention op, so this times the op with ``test-backend-ops perf`` at the tensors llama.cpp's
graph hands it. A drop-in measure: values are op runs per second (10^6 / µs per run), **not** tokens per second,
and an op-level gain exceeds the end-to-end one, so the confirm (llama-bench) is the judge.

Cache cells (``n_kv``) are padded to 256: decode at depth ``d`` reads ``pad256(d + tg)`` cells with one query
row; prefill's last micro-batch reads ``pad256(d + pp)`` cells with ``min(pp, ub)`` query rows.

Which tool times the kernel screen (``--screen``; :func:`screen_method`) is one rule for the search and its dry
run. The kernel level stands for what llama-bench would time only where the whole model runs on an NVIDIA GPU
with kernels to force (no ``--cpu-mask``, where the host paces a step) and the live llama-bench measures.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from tuner.errors import UsageError
from tuner.measure.kernel_bench import FaShape, KernelTime, process_timeout, run_round
from tuner.plan.space import SearchSpace, runtime_env_and_args
from tuner.rounds.joint import Candidate, Point
from tuner.search.residency_gate import full_offload
from tuner.targets.target import Target

METHOD_KERNEL = "kernel"
METHOD_BENCH = "llama-bench"

_PAD = 256
_UB_DEFAULT = 512  # llama-bench's default -ub (n_ubatch)


def _pad(n: int) -> int:
    return -(-n // _PAD) * _PAD


def _ubatch(bench_args: Sequence[str]) -> int:
    args = list(bench_args)
    for flag in ("-ub", "--ubatch-size"):
        if flag in args[:-1]:
            return int(args[args.index(flag) + 1].split(",")[0])
    return _UB_DEFAULT


def kernel_shape(
    shape: Mapping[str, int], phase: str, depth: int, *, pp: int, tg: int, kv_type: str, ubatch: int = _UB_DEFAULT
) -> FaShape:
    """The FA call a llama-bench ``phase`` test makes at ``depth`` for a model ``shape`` (module docstring)."""
    d = int(shape["head_dim"])
    common = {"head_dim": d, "head_dim_v": d, "n_head": int(shape["n_heads"]), "n_head_kv": int(shape["n_kv_heads"])}
    if phase == "tg":
        return FaShape(**common, n_kv=_pad(depth + tg), n_batch=1, kv_type=kv_type)
    return FaShape(**common, n_kv=_pad(depth + pp), n_batch=min(pp, ubatch), kv_type=kv_type)


_DEVICE = re.compile(r"Device description:\s*(.+)")


@dataclasses.dataclass(eq=False)  # a measure is itself, not its settings
class KernelMeasure:
    """The screen measure for the build in ``bin_dir`` (one phase per call) with ``joint`` (several phases per
    process) and ``info``; the pinned ``bench_args``' ``-ub`` sets the prefill rows."""

    bin_dir: Path
    shape: Mapping[str, int]
    _: dataclasses.KW_ONLY
    pp: int
    tg: int
    kv_type: str
    bench_args: Sequence[str] = ()
    log_dir: Path
    backend: str = "CUDA0"
    info: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ubatch = _ubatch(self.bench_args)

    def joint(
        self, cand: Candidate, phases: Sequence[str], depths: Sequence[int], label: str
    ) -> dict[str, dict[int, Point]]:
        cases = [(p, int(d)) for p in phases for d in depths]
        shapes = [
            kernel_shape(self.shape, p, d, pp=self.pp, tg=self.tg, kv_type=self.kv_type, ubatch=self.ubatch)
            for p, d in cases
        ]
        # The same n_kv can serve two depths' decode and prefill cases: one process times each case apart.
        times = run_round(
            self.bin_dir,
            shapes,
            {label: dict(cand.env)},
            log_dir=self.log_dir / label,
            backend=self.backend,
            timeout=process_timeout(len(shapes)),
        )
        self._read_device(times)
        out: dict[str, dict[int, Point]] = {p: {} for p in phases}
        for (p, d), t in zip(cases, times, strict=True):
            us = t.us_per_run if t.us_per_run is not None and t.us_per_run > 0 else None
            out[p][d] = {
                "ts": None if us is None else 1e6 / us,
                "kernel": t.kernel,
                "why": t.why,
                "error": "" if us is not None else (t.error or f"no time; see {t.log_file}"),
            }
        return out

    def __call__(self, cand: Candidate, phase: str, depths: Sequence[int], label: str) -> Mapping[int, Point]:
        return self.joint(cand, [phase], depths, label)[phase]

    def _read_device(self, times: Sequence[KernelTime]) -> None:
        if self.info or not times or not times[0].log_file:
            return
        try:
            m = _DEVICE.search(Path(times[0].log_file).read_text(errors="replace"))
        except OSError:
            return
        if m:
            self.info["device"] = m.group(1).strip()


def coerce_pins(space: SearchSpace, pins: Mapping[str, object]) -> dict[str, object]:
    """``--set`` pins as ``space``'s knobs take them (``variant`` names a build, not a knob: kept as given)."""
    return {k: (v if k == "variant" else space.knob(k).coerce(v)) for k, v in pins.items()}


def pinned_runtime(space: SearchSpace, fixed: Mapping[str, object]) -> tuple[dict[str, str], list[str]]:
    """The env vars and llama-bench arguments of the pinned (``--set``) runtime knobs, ``fixed`` coerced already."""
    names = {k.name for k in space.runtime_knobs}
    return runtime_env_and_args(space, {k: v for k, v in fixed.items() if k in names})


def screen_method(
    asked: str | None,
    *,
    target: Target,
    has_kernels: bool,
    base_args: Sequence[str],
    n_layers: int | None,
    cpu_mask: Sequence[int] | None,
    custom_measure: bool = False,
) -> str:
    """The screen's tool for a new study: ``asked`` (None or ``auto``: the rule); UsageError for ``--screen
    kernel`` where no kernel can be forced on an NVIDIA GPU. ``custom_measure``: a test's or replay's measure."""
    vendor = target.arch.vendor
    nvidia_gpu = vendor == "nvidia" and not target.is_cpu
    if asked == METHOD_KERNEL and not (nvidia_gpu and has_kernels):
        raise UsageError(
            f"--screen kernel times the FlashAttention kernels tuner can force on an NVIDIA GPU; {target.name} "
            f"({'no kernel to force' if nvidia_gpu else vendor}) has none. "
            "Use --screen llama-bench (or auto)."
        )
    if asked not in (None, "auto"):
        return asked
    host_paced = bool(cpu_mask) or not full_offload(base_args, n_layers)
    return METHOD_KERNEL if nvidia_gpu and has_kernels and not host_paced and not custom_measure else METHOD_BENCH
