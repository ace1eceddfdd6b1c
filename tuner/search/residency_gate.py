"""The residency gate (docs/soak.md): the final config keeps the graph and the memory where upstream's does.

One verbose llama-bench probe each of upstream's and the final config is read for graph splits, offloaded
layers, buffers and fused-op fallbacks, and judged. A final config that fails where upstream's passes, or has
more decode-graph splits, is infeasible: upstream's selection is exported. Upstream's config sets the scenario:
under full offload the final config must offload everything too; where upstream keeps layers or the KV cache on
the host, both probes are reported, not judged (on the H100 ``-ngl 8 -nkvo 1`` had 16 decode splits to
upstream's 2); on the CPU backend the check passes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tuner import log
from tuner.measure.residency import Residency, judge, parse_residency
from tuner.rounds.output_gate import upstream_instead


def full_offload(args: Sequence[str], n_layers: int | None) -> bool:
    """True unless ``args`` keep layers (``-ngl`` below ``n_layers`` + 1, the output layer) or the KV cache
    (``-nkvo 1``) on the host; llama-bench's default offloads everything."""
    a = list(args)
    for flag in ("-nkvo", "--no-kv-offload"):
        if flag in a and a.index(flag) + 1 < len(a) and a[a.index(flag) + 1] not in ("0", "false"):
            return False
    for flag in ("-ngl", "--n-gpu-layers"):
        if flag in a and a.index(flag) + 1 < len(a) and n_layers is not None:
            try:
                if int(a[a.index(flag) + 1]) < n_layers + 1:
                    return False
            except ValueError:
                return False
    return True


def summary_row(res: Residency, passed: bool, reasons: Sequence[str]) -> dict[str, object]:
    return {
        "summary": res.summary,
        "passed": bool(passed),
        "reasons": list(reasons),
        "splits_pp": res.splits_pp,
        "splits_tg": res.splits_tg,
        "layers_offloaded": res.layers_offloaded,
        "layers_total": res.layers_total,
        "device_weights_mib": round(res.device_weights_mib, 2),
        "host_weights_mib": round(res.host_weights_mib, 2),
        "kv_buffers": dict(res.kv_buffers),
        "host_kv_mib": round(res.host_kv_mib, 2),
        "fallbacks": len(res.fallbacks),
        "gpu": res.gpu,
        "error": res.error,
        "log": str(res.log_file) if res.log_file else None,
    }


def decide(up: Residency, final: Residency | None, *, full: bool, host_weights_mib: float | None) -> dict[str, Any]:
    """The residency gate's record from the two parsed probes (``final`` None: the final config is upstream's);
    ``verdict`` ``pass``, ``fail`` or ``not judged``."""
    ok_up, why_up = judge(up, full_offload=full, host_weights_mib=host_weights_mib)
    rec: dict[str, Any] = {"full_offload": full, "upstream": summary_row(up, ok_up, why_up), "final": None}
    if final is None:
        rec.update(
            verdict="pass" if ok_up else "not judged",
            reasons=list(why_up),
            why="the final config is upstream's" + ("" if ok_up else "; upstream's own probe fails, reported only"),
        )
        return rec
    ok, why = judge(final, full_offload=full, host_weights_mib=host_weights_mib)
    rec["final"] = summary_row(final, ok, why)
    more_splits = full and final.splits_tg is not None and up.splits_tg is not None and final.splits_tg > up.splits_tg
    if ok and not more_splits:
        rec.update(
            verdict="pass",
            reasons=[],
            why="full offload kept"
            if full and up.gpu
            else (
                "partial offload (upstream's config keeps layers or the KV cache on the host): reported, not judged"
                if not full
                else "CPU backend: everything on the host by design"
            ),
        )
    elif ok_up or more_splits:
        extra = [f"The decode graph has {final.splits_tg} splits, upstream's {up.splits_tg}."] if more_splits else []
        rec.update(verdict="fail", reasons=[*why, *extra], why="the final config moves work or memory off the GPU")
    else:
        rec.update(
            verdict="not judged",
            reasons=list(why),
            why="upstream's own probe fails the same check, so it cannot tell the configs apart",
        )
    return rec


def redecide(rec: Mapping[str, Any], *, full: bool, host_weights_mib: float | None) -> dict[str, Any] | None:
    """A stored record decided again from its probes' logs by today's rule; None where a log is gone or a probe
    had failed (the stored record stands)."""

    def load(p: Mapping[str, Any] | None) -> Residency | None:
        if not p or p.get("error") or not p.get("log") or not Path(p["log"]).is_file():
            return None
        return parse_residency(Path(p["log"]).read_text(errors="replace"))

    up = load(rec.get("upstream"))
    final = load(rec.get("final")) if rec.get("final") else None
    if up is None or (rec.get("final") and final is None):
        return None
    out = decide(up, final, full=full, host_weights_mib=host_weights_mib)
    for side in ("upstream", "final"):  # the rows keep pointing at the logs they came from
        if out.get(side) and rec.get(side):
            out[side]["log"] = rec[side]["log"]
    return out


def residency_result(result: Mapping[str, object], rec: Mapping[str, Any]) -> dict[str, Any]:
    """The result with its residency record; upstream's selection when the final config failed (as the gate does)."""
    if rec["verdict"] != "fail":
        return {**result, "residency": dict(rec)}
    why = " ".join(rec["reasons"])
    log.warning(
        f"RESIDENCY CHECK FAILED for the final config ({why}). It is infeasible and is NOT exported; "
        "the result is upstream's selection."
    )
    out, rejected = upstream_instead(result, "failed the residency check with the final config")
    return {**out, "residency": {**dict(rec), "rejected": rejected}}
