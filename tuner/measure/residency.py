"""Graph splits and memory residency, read from llama.cpp's own loader and scheduler output (docs/soak.md).

One verbose llama-bench call (``-v``, one test ``-pg PP,TG``, one repetition) makes llama.cpp print,
in the pinned tree's format strings:

- ``load_tensors: offloaded %d/%d layers to GPU`` (llama-model.cpp; GPU builds only) and, verbose,
  ``load_tensors: layer %3d assigned to device %s, is_swa = %d`` per layer;
- ``load_tensors: %12s model buffer size = %8.2f MiB`` per weight buffer (``CUDA0``, ``CPU_Mapped``);
- ``llama_kv_cache: layer %3d: dev = %s`` per layer and ``llama_kv_cache: %10s KV buffer size = ...``;
- ``sched_reserve: %10s compute buffer size = ...`` and ``llama_context: %10s  output buffer size = ...``;
- ``sched_reserve: graph (pp bs=%d, tg bs=%d): nodes = %s, splits = %s, ...`` (one number when the
  prefill and decode graphs agree); older trees print ``graph splits = %d`` instead;
- ``... layer %d is assigned to device %s but %s is assigned to device %s (usually due to missing
  support)``: a fused op the GPU backend cannot run, i.e. a decode op falling back to the CPU.

:func:`judge` is the rule: with full offload on a GPU backend, the layers and the KV cache must be on the
GPU, no fused op may fall back, and the decode graph may have at most ``max_splits`` splits. Why 2:
llama.cpp always keeps the input layer (token embeddings) on the CPU (llama-model.cpp, "there is very
little benefit to offloading the input layer"), so a full offload is one host split (the embedding
lookup) and one GPU split; each further split is a hand-over between backends inside a token. For the
same reason host weights up to the input embeddings' size (:func:`input_layer_mib`) are legitimate.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from tuner import log
from tuner.errors import UsageError
from tuner.measure.bench import PROBE_OWN_FLAGS, check_passthrough_args
from tuner.measure.exe import bench_exit_error, check_model, find_exe, run_tool
from tuner.targets.models import load_gguf_tensors

DEFAULT_MAX_SPLITS = 2
"""Decode-graph splits allowed for full offload: the host embedding lookup plus one GPU split."""

# Rounding of "%8.2f MiB" plus per-tensor alignment padding in a host buffer.
_HOST_SLACK_MIB = 1.0

_F = r"([0-9]+(?:\.[0-9]+)?)"
_BUF = re.compile(rf"^(\w+):\s+(\S+)\s+(model |KV |RS |compute | output |)buffer size\s*=\s*{_F} MiB", re.M)
_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
_LAYER_DEV = re.compile(r"load_tensors: layer\s+(\d+) assigned to device (\S+?),")
_KV_DEV = re.compile(r"llama_kv_cache: layer\s+(\d+): dev = (\S+)")
_GRAPH_NEW = re.compile(
    r"graph(?: \(pp bs=(\d+), tg bs=(\d+)\))?: nodes = (\d+)(?: / (\d+))?, splits = (\d+)(?: / (\d+))?"
)
_GRAPH_OLD_SPLITS = re.compile(r"graph splits\s*=\s*(\d+)")
_GRAPH_OLD_NODES = re.compile(r"graph nodes\s*=\s*(\d+)")
_USING_DEV = re.compile(r"using device (\S+) \(([^)]*)\)")
_FALLBACK = re.compile(
    r"layer \d+ is assigned to device \S+ but .+ is assigned to device \S+ \(usually due to missing support\)"
)
_INPUT_TENSORS = ("token_embd.", "token_embd_norm.", "position_embd.", "token_types.")


def is_host_buffer(name: str) -> bool:
    """True for buffers in host memory: ``CPU``, ``CPU_Mapped``, ``CPU_REPACK``, ``CUDA_Host``, ``ROCm_Host``...
    and ``AMX`` (ggml-cpu's buffer for weights repacked for Intel AMX tiles, on hosts that have AMX)."""
    return name.upper().startswith("CPU") or name.endswith("_Host") or name.upper() == "AMX"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Residency:
    """What one llama.cpp run said about where its graph runs and its memory lives (MiB per buffer name)."""

    model_buffers: Mapping[str, float]
    kv_buffers: Mapping[str, float]
    compute_buffers: Mapping[str, float]
    output_buffers: Mapping[str, float]
    layers_offloaded: int | None
    """From ``offloaded N/M layers to GPU``; None when not printed (CPU-only builds)."""
    layers_total: int | None
    layer_devices: Mapping[int, str]
    """Device per model layer (the last is the output layer), verbose only."""
    kv_devices: Mapping[int, str]
    """Device per KV-cache layer, verbose only."""
    splits_pp: int | None
    splits_tg: int | None
    """Graph splits of the prefill and decode (one token) graphs; equal when llama.cpp printed one number."""
    nodes_pp: int | None
    nodes_tg: int | None
    devices: tuple[str, ...]
    """Devices llama.cpp chose (``CUDA0 (NVIDIA H100 80GB HBM3)``), from ``using device`` lines."""
    fallbacks: tuple[str, ...]
    """``... (usually due to missing support)`` warnings: fused ops placed off their layer's device."""
    error: str = ""
    """Why the run failed ('' when it ran)."""
    log_file: Path | None = None

    @property
    def gpu(self) -> bool:
        """A GPU backend holds weights or KV, or llama.cpp reported GPU offload or devices."""
        return (
            any(not is_host_buffer(n) for n in (*self.model_buffers, *self.kv_buffers))
            or bool(self.devices)
            or self.layers_total is not None
        )

    @property
    def host_weights_mib(self) -> float:
        return sum(v for k, v in self.model_buffers.items() if is_host_buffer(k))

    @property
    def device_weights_mib(self) -> float:
        return sum(v for k, v in self.model_buffers.items() if not is_host_buffer(k))

    @property
    def host_kv_mib(self) -> float:
        return sum(v for k, v in self.kv_buffers.items() if is_host_buffer(k))

    @property
    def summary(self) -> str:
        """One line for people: splits, offload, where weights and KV live."""
        if self.error:
            return f"residency run failed: {self.error}"

        def bufs(d: Mapping[str, float]) -> str:
            return ", ".join(f"{k} {v:.2f} MiB" for k, v in d.items()) or "none"

        off = "no GPU offload reported"
        if self.layers_total is not None:
            off = f"offloaded {self.layers_offloaded}/{self.layers_total} layers"
        sp = f"{self.splits_pp} prefill / {self.splits_tg} decode"
        if self.splits_tg is None or self.splits_pp == self.splits_tg:
            sp = "?" if self.splits_tg is None else str(self.splits_tg)
        return f"graph splits {sp}; {off}; weights: {bufs(self.model_buffers)}; KV: {bufs(self.kv_buffers)}"


def parse_residency(text: str) -> Residency:
    """Parse llama.cpp's loader/context/scheduler log (either era's wording); missing lines are None/empty.

    When the log holds several contexts (several llama-bench tests), the last one's numbers win.
    """
    groups: dict[str, dict[str, float]] = {"model": {}, "kv": {}, "compute": {}, "output": {}}
    kind = {"model ": "model", "KV ": "kv", "RS ": "kv", "compute ": "compute", " output ": "output"}
    for fn, name, what, mib in _BUF.findall(text):
        # Before "model" was in the line (2024 trees) a load_tensors buffer line was the weights.
        g = kind.get(what) or ("model" if "load_tensors" in fn else None)
        if g is not None:
            groups[g][name] = float(mib)
    off = _OFFLOADED.findall(text)
    splits_pp = splits_tg = nodes_pp = nodes_tg = None
    new = _GRAPH_NEW.findall(text)
    if new:
        _, _, n1, n2, s1, s2 = new[-1]
        nodes_pp, nodes_tg = int(n1), int(n2 or n1)
        splits_pp, splits_tg = int(s1), int(s2 or s1)
    else:
        old = _GRAPH_OLD_SPLITS.findall(text)
        if old:
            splits_pp = splits_tg = int(old[-1])
        nodes = _GRAPH_OLD_NODES.findall(text)
        if nodes:
            nodes_pp = nodes_tg = int(nodes[-1])
    devices = tuple(dict.fromkeys(f"{d} ({desc})" for d, desc in _USING_DEV.findall(text)))
    return Residency(
        model_buffers=groups["model"],
        kv_buffers=groups["kv"],
        compute_buffers=groups["compute"],
        output_buffers=groups["output"],
        layers_offloaded=int(off[-1][0]) if off else None,
        layers_total=int(off[-1][1]) if off else None,
        layer_devices={int(i): d for i, d in _LAYER_DEV.findall(text)},
        kv_devices={int(i): d for i, d in _KV_DEV.findall(text)},
        splits_pp=splits_pp,
        splits_tg=splits_tg,
        nodes_pp=nodes_pp,
        nodes_tg=nodes_tg,
        devices=devices,
        fallbacks=tuple(dict.fromkeys(m.group(0) for m in _FALLBACK.finditer(text))),
    )


def input_layer_mib(model: Path) -> float:
    """MiB of the input-layer tensors (token embeddings...) that llama.cpp always keeps on the host."""
    return sum(t.n_bytes for t in load_gguf_tensors(Path(model)) if t.name.startswith(_INPUT_TENSORS)) / 2**20


def judge(
    res: Residency,
    *,
    full_offload: bool = True,
    max_splits: int = DEFAULT_MAX_SPLITS,
    host_weights_mib: float | None = None,
) -> tuple[bool, tuple[str, ...]]:
    """The rule: ``(passed, reasons)``; a pure function of a parsed run.

    Only a GPU run of a full-offload config (``-ngl`` at or above the layer count, no ``-nkvo``) is judged;
    partial-offload configs and the CPU backend pass, their numbers only reported. ``host_weights_mib``:
    host weight MiB allowed (:func:`input_layer_mib` of the model); None: not checked.
    """
    if res.error:
        return False, (f"The residency run failed: {res.error}",)
    if not res.gpu or not full_offload:
        return True, ()
    why: list[str] = []
    if res.splits_tg is None:
        why.append("llama.cpp printed no graph split count (was the run verbose, -v?).")
    elif res.splits_tg > max_splits:
        why.append(
            f"The decode graph has {res.splits_tg} splits, more than the {max_splits} of a full offload "
            "(host embedding lookup + one GPU split): some ops run on another backend within each token."
        )
    if res.layers_total is not None and (res.layers_offloaded or 0) < res.layers_total:
        why.append(f"Only {res.layers_offloaded}/{res.layers_total} layers were offloaded to the GPU.")
    if host_layers := sorted(i for i, d in res.layer_devices.items() if is_host_buffer(d)):
        why.append(f"Layers {host_layers} are assigned to the CPU.")
    if not res.device_weights_mib > 0:
        why.append("No model weights are in a GPU buffer.")
    if host_weights_mib is not None and res.host_weights_mib > host_weights_mib + _HOST_SLACK_MIB:
        why.append(
            f"{res.host_weights_mib:.2f} MiB of weights are in host buffers, more than the "
            f"{host_weights_mib:.2f} MiB input layer llama.cpp keeps there."
        )
    kv_host = sorted(i for i, d in res.kv_devices.items() if is_host_buffer(d))
    if res.host_kv_mib > 0 or kv_host:
        why.append(
            f"The KV cache is (partly) in host memory ({res.host_kv_mib:.2f} MiB"
            + (f", layers {kv_host}" if kv_host else "")
            + "): -nkvo or a layer left on the CPU."
        )
    elif not res.kv_buffers:
        why.append("llama.cpp printed no KV buffer.")
    if res.fallbacks:
        why.append(f"{len(res.fallbacks)} fused op(s) fell back off the GPU: {res.fallbacks[0]}.")
    return not why, tuple(why)


def run_residency(
    bin_dir: Path,
    model: Path,
    *,
    env: Mapping[str, str] = {},
    args: Sequence[str] = (),
    log_dir: Path,
    pp: int = 512,
    tg: int = 16,
    timeout: float = 900.0,
) -> Residency:
    """Run ``llama-bench -v -pg PP,TG -r 1`` once with a config's env and arguments and parse its log.

    One ``-pg`` test makes one context whose scheduler reserves both the prefill and the decode graph, so
    both split counts are printed. A failed run is a Residency with ``error`` set, never an exception.

    Raises:
        UsageError: No llama-bench in ``bin_dir``, no model, a bad argument.
    """
    exe = find_exe(Path(bin_dir), "llama-bench")
    check_model(model)
    for name, v in (("pp", pp), ("tg", tg)):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1 << 20:
            raise UsageError(f"{name} must be a positive integer (got {v!r}).")
    cmd = [str(exe), "-m", str(model), "-p", "0", "-n", "0", "-pg", f"{pp},{tg}", "-r", "1", "--no-warmup", "-v"]
    own = "the residency check itself (model, -pg, -r, -o, -v)"
    cmd += ["-o", "jsonl", *check_passthrough_args(args, PROBE_OWN_FLAGS, sets=own)]
    log_file = Path(log_dir) / "residency.log"
    log_file.unlink(missing_ok=True)
    lines: list[str] = []
    with log.step(f"residency: llama-bench -v -pg {pp},{tg}"):
        rc, err = run_tool(
            cmd, env, log_file=log_file, timeout=timeout, on_line=lines.append, what="llama-bench (residency)"
        )
        if not err and rc != 0:
            err = bench_exit_error(rc, lines, log_file)
    res = parse_residency("\n".join(lines))
    if not err and res.splits_tg is None and not res.model_buffers:
        err = f"llama-bench printed no loader or scheduler lines; log {log_file}"
    return dataclasses.replace(res, error=err, log_file=log_file)
