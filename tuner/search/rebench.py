"""``tuner validate --bench``: do a stored result's claims still hold on this machine?

Every point the result claims (verdict "faster") is measured again the way the search confirmed it: upstream,
its A/A twin and the result's configuration in paired rounds on the result's variant. A claim holds when it is
still "faster".
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner.builder import cmake
from tuner.plan import render
from tuner.plan.fa_rules import rules_env, rules_from_texts
from tuner.rounds import live
from tuner.rounds.joint import Candidate, run_phase_rounds
from tuner.rounds.stats import AA_NAME, UPSTREAM, summarize_phase
from tuner.source import Source


def rebench(
    cfg: Mapping[str, Any], *, source: Source, model: Path | None, rounds: int = 3, log_dir: Path | None = None
) -> tuple[bool, str]:
    """(holds, detail): each claimed point re-measured against upstream (``rounds`` paired rounds)."""
    claims = [p for p in cfg.get("points", []) if p.get("verdict") == "faster"]
    if not claims:
        return True, "nothing to re-measure: the result claims no point over upstream"
    if model is None:
        return False, f"not measured: pass --model (the result was measured on {cfg['model'].get('file')})"
    choice = cfg["choice"]
    rv = render.render_variant(source, cfg["target"]["arch"], choice["variant"], compile_values=dict(choice["compile"]))
    build = cmake.build_variant(rv)
    env = {**dict(choice.get("fa_env", {})), **dict(choice.get("runtime_env", {}))}
    if choice["fa_rules"]:
        env["GGML_TUNER_FA_RULES"] = rules_env(rules_from_texts(choice["fa_rules"]))
    cands = [
        Candidate(name=UPSTREAM),
        Candidate(name=AA_NAME),
        Candidate(name="tuned", env=env, args=tuple(choice.get("bench_args", []))),
    ]
    run = log_dir or Path(tempfile.mkdtemp(prefix="tuner-rebench-"))
    pp, tg = int(cfg["model"].get("pp", 512)), int(cfg["model"].get("tg", 128))
    measure = live.make_live_measure(
        build.bin_dir,
        model,
        pp=pp,
        tg=tg,
        reps={"pp": 3, "tg": 3},
        log_dir=run / "logs",
        era=source.era,
        arch=cfg["target"]["arch"],
    )
    rows, ok = [], True
    for phase in ("pp", "tg"):
        depths = sorted({int(p["depth"]) for p in claims if p["phase"] == phase})
        if not depths:
            continue
        recs: list[dict[str, Any]] = []
        run_phase_rounds(
            measure, phase, cands, depths, recs, min_rounds=rounds, max_rounds=rounds, target_ci=0.0, tag="rebench"
        )
        for d, cell in summarize_phase(phase, recs, depths).items():
            e, v = cell.effects.get("tuned"), cell.verdicts.get("tuned", "fell back")
            ok &= v == "faster"
            rows.append(
                f"{phase}{pp if phase == 'pp' else tg}@d{d}: {v}"
                + (
                    f" {e.pct:+.1f}% [{100 * (e.ci_low - 1):+.1f}, {100 * (e.ci_high - 1):+.1f}], A/A ±{cell.noise_pct:.1f}%"
                    if e
                    else ""
                )
            )
    return ok, f"{rounds} paired rounds, logs {run}: " + "; ".join(rows)
