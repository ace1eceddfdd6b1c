"""``PR.md`` of a merged table for a llama.cpp maintainer: the patched entries with each GPU model's verdict,
one compare table per GPU model, the commands that reproduce every number, the checks and a short method;
everything else is in ``report.md``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from tuner.result.tables import compare_table
from tuner.sweep import confirm
from tuner.sweep.confirm import RuleFate
from tuner.sweep.gpus import Confirmation, Joined, differs, gpu_specs
from tuner.targets.defaults import DEFAULT_QUANT
from tuner.targets.quant_types import quant_type


def confirm_command(c: Confirmation, *, has_mmq: bool, out: str) -> str:
    """The ``tuner sweep confirm`` call that measured ``c``, on stores unpacked to ``<part>/fa``, ``/mmq``."""
    rows = c.models
    base = [r for r in rows if "pass" not in r and "batch" not in r]
    likes = list(dict.fromkeys(str(r["like"]) for r in base))
    depths = sorted({int(d) for r in base for d in _ints(r.get("depths"))})
    passes = [r for r in rows if "pass" in r]
    args = [f"tuner sweep confirm {c.part}/fa", *([f"--mmq {c.part}/mmq"] if has_mmq else [])]
    args += [f"--like {x}" for x in likes]
    quant = _quant(c)
    if quant != DEFAULT_QUANT.upper():
        args.append(f"--quant {quant}")
    if tuple(depths) != confirm.DEFAULT_DEPTHS:
        args.append(f"--depths {','.join(map(str, depths))}")
    if any(f.choice is not None for f in c.confirmed.fates):  # the table has MMQ choices
        mmq_like = str(passes[0]["like"]) if passes else "none"
        if mmq_like != "llama-3.1-8b":
            args.append(f"--mmq-like {mmq_like}")
    rounds = {int(str(r.get("rounds", 3))) for r in rows}
    if rounds != {3}:
        args.append(f"--rounds {max(rounds)}")
    return " ".join([*args, f"-o {out}"])


def _quant(c: Confirmation) -> str:
    """The models' type the store recorded, checked (it is printed into PR.md's commands): UsageError otherwise."""
    return quant_type(c.identity.get("quant", DEFAULT_QUANT))


def _ints(v: object) -> list[int]:
    return [int(x) for x in v if isinstance(x, int)] if isinstance(v, list) else []


def _verdict_cell(j: Joined, device: str) -> str:
    v = next((v for v in j.verdicts if v.device == device), None)
    return v.word if v else "not measured"


def _entry_text(fate: RuleFate) -> str:
    if fate.choice is not None:
        c = fate.choice
        return (
            f"`{fate.text}`: {c.type} weights to cuBLAS from batch {c.lo}"
            + (f" to {c.hi}" if c.hi else "")
            + f" (needs `-ub >= {c.lo}`; the default `-ub 512` never reaches it)"
        )
    return f"`{fate.text}`"


def _points(entry: int, confs: Sequence[Confirmation], fate: RuleFate) -> list[dict[str, object]]:
    """The rows of one patched entry on one GPU model (for an MMQ choice also its weights below its batch)."""
    out: list[dict[str, object]] = []
    for c in confs:
        quant = _quant(c)
        label = "" if quant == DEFAULT_QUANT.upper() else f" {quant}"
        out += [{**p, "model": f"{p['model']}{label}"} for p in c.confirmed.fates[entry].touched]
        ch = fate.choice
        if ch is None:
            continue
        for like, types in c.confirmed.weight_types.items():
            # the choice's own weight type at llama-bench's default -ub, where its batch is never reached
            if quant.upper().startswith(ch.type.upper()) and ch.type.lower() in {t.lower() for t in types}:
                below = [p for p in c.confirmed.points.get(like, ()) if not ch.covers(int(str(p.get("ne11", 1))))]
                out += [{**p, "model": f"{p['model']}{label}, -ub 512"} for p in below]
    return out


def _caption(device: str) -> str:
    spec = gpu_specs().get(device)
    if spec is None:
        return f"## {device}"
    return (
        f"## {device}: {spec['sms']} SMs, max SM clock {spec['max_sm_clock_mhz']} MHz, "
        f"{spec['memory_bandwidth_tbs']} TB/s ({spec['memory']}; {spec['source']})"
    )


def _op_text(r: Mapping[str, object]) -> str:
    """One stored test-backend-ops run; a FLASH_ATTN_EXT run names the head sizes its case filter selected (a run
    stored before an entry of another head size was kept does not cover that entry)."""
    heads = sorted({int(h) for h in re.findall(r"hsk=(\d+)", str(r.get("params") or ""))})
    cover = f"; head sizes {', '.join(map(str, heads))}" if heads else ""
    return f"{r.get('op')} {'PASS' if r.get('passed') else 'FAIL'} ({r.get('summary', '')}{cover})"


def _ops_line(device: str, confs: Sequence[Confirmation]) -> str:
    each = [f"{c.part}: " + ", ".join(_op_text(r) for r in c.backend_ops) for c in confs if c.backend_ops]
    if not each:
        return f"- test-backend-ops on {device}: not run (no entry kept there)"
    return (
        f"- test-backend-ops on {device}, each confirmation's kept entries, against the CPU backend: {'; '.join(each)}"
    )


def _gate_line(device: str, confs: Sequence[Confirmation]) -> str:
    gates = {like: g for c in confs for like, g in c.confirmed.gates.items() if g}
    failed = sorted(like for like, g in gates.items() if g.get("verdict") != "pass")
    verdict = f"FAIL on {', '.join(failed)}" if failed else "PASS"
    return (
        f"- Output equivalence on {device} (llama-perplexity KLD of the table against upstream, within twice the "
        f"spread of upstream's own kernels): {verdict}, {len(gates)} model(s)"
    )


def table_pr_text(
    *,
    arch: str,
    joined: Sequence[tuple[int, Joined]],
    confirmations: Sequence[Confirmation],
    patch: str,
    has_mmq: Mapping[str, bool],
) -> str:
    """PR.md (module doc); ``confirmations``: every confirm store, the first GPU model's first."""
    devices = list(dict.fromkeys(c.device for c in confirmations))
    patched = [(i, j) for i, j in joined if j.kept]
    dropped = [(i, j) for i, j in joined if j.action == "dropped"]
    guard = re.search(r"cc == GGML_CUDA_CC_\w+", patch)
    what = "FlashAttention kernel" + (" and MMQ-vs-cuBLAS" if any(j.fate.choice for _, j in joined) else "")
    lines = [
        f"# CUDA: {what} selection for {arch}, measured on {' and '.join(devices)}",
        "",
        (
            f"`upstream.patch` adds {len(patched)} entr{'y' if len(patched) == 1 else 'ies'}, "
            f"keyed on `{guard.group() if guard else arch}`; a shape it does not list keeps upstream's logic."
            if patch
            else "No patch: no entry was faster end to end on any GPU model without being slower on another."
        ),
        "",
        "| Entry | " + " | ".join(devices) + " |",
        "|---|" + "---|" * len(devices),
    ]
    lines += [
        f"| {_entry_text(j.fate)} | " + " | ".join(_verdict_cell(j, d) for d in devices) + " |" for _, j in patched
    ]
    if dropped:
        lines += [
            "",
            "Dropped, as the GPU models disagree and the patch keys entries on the compute capability alone:",
            "",
        ]
        for _, j in dropped:
            key = differs(devices)
            lines.append(
                f"- `{j.fate.text}`: {j.why}"
                + (f". A run-time key on their {key} would separate them; this patch adds none." if key else ".")
            )
    lines += [
        "",
        "faster: faster end to end beyond the A/A noise where the entry acts; no gain: measured there, within the "
        "noise; not measured: no confirmed model of its shape on that GPU model. Below, per GPU model, the points "
        "the patched entries act on.",
    ]
    for d in devices:
        mine = [c for c in confirmations if c.device == d]
        rows, unmeasured = [], []
        for i, j in patched:
            got = _points(i, [c for c in mine if c.part == _part_of(j, mine)], j.fate)
            rows += got
            if j.fate.choice is not None and not any(", -ub 512" in str(p["model"]) for p in got):
                unmeasured.append(f"- `{j.fate.text}` at the default `-ub 512`: not measured on {d}.")
        unique: dict[tuple[object, ...], dict[str, object]] = {}
        for p in rows:
            unique.setdefault((p["model"], p["test"], p["depth"]), p)
        rows = list(unique.values())
        lines += ["", _caption(d), ""]
        lines.append(
            compare_table(rows, name_a="upstream", name_b="table") if rows else "No point of a patched entry measured."
        )
        lines += ["", *unmeasured] if unmeasured else []
    lines += ["", "## Reproduce", "", "From this folder, with tuner installed, on each GPU model:", "", "```sh"]
    for part in dict.fromkeys(c.part for c in confirmations):  # the sweeps' stores, once a part
        mmq = has_mmq.get(part)
        lines += [
            f"E=parts/{part}/evidence; mkdir -p {part}/fa" + (f" {part}/mmq" if mmq else ""),
            f"xz -dc $E/sweep.sqlite3.xz > {part}/fa/sweep.sqlite3"
            + (f"; xz -dc $E/mmq.sqlite3.xz > {part}/mmq/mmq.sqlite3" if mmq else ""),
        ]
    for c in confirmations:
        out = f"{c.part}/confirm" if c.device == devices[0] else f"{c.part}/{c.name}-{c.folder.split('/')[-2]}"
        lines += [f"# on {c.device}", confirm_command(c, has_mmq=bool(has_mmq.get(c.part)), out=out)]
    lines += [
        "```",
        "",
        "The stores read here: " + ", ".join(f"`{c.folder}/confirm.sqlite3.xz`" for c in confirmations) + ".",
        "",
        "## Checks",
        "",
    ]
    for d in devices:
        mine = [c for c in confirmations if c.device == d]
        lines += [_ops_line(d, mine), _gate_line(d, mine)]
    lines += [
        "",
        "## Method",
        "",
        "1. Kernel level: every (head size, GQA, K/V type, batch, n_kv) cell times each legal kernel against "
        "upstream's choice and an A/A copy of it, in paired rounds; MMQ against cuBLAS the same way per type and batch.",
        "2. End to end: random-weight models of each shape, llama-bench against upstream with the table in the "
        "build's runtime hook, paired interleaved rounds with an A/A pair; a verdict only where the paired 95% CI "
        "clears the A/A noise.",
        "3. On each GPU model apart; an entry is patched where it is faster on one and slower on none, and the "
        "output-equivalence gate passes.",
        "4. Speedup = t/s table / t/s upstream (compare-llama-bench.py's figure); Noise = upstream against itself.",
        "5. Details, every model's rows and the entries not patched: `report.md`; the method: `docs/sweep.md` in "
        "the tuner repository.",
        "",
    ]
    return "\n".join(lines)


def _part_of(j: Joined, confs: Sequence[Confirmation]) -> str:
    """The part whose confirmations decided ``j`` (its fate is one of theirs)."""
    return next((c.part for c in confs if any(f.text == j.fate.text for f in c.confirmed.fates)), "")
