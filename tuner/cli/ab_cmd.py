"""``tuner ab``: A/B by hand — runtime configurations of one build, paired and interleaved."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from tuner import log
from tuner.cli._params import (
    DIR,
    EXISTING_FILE,
    build_option,
    depths_option,
    number_option,
    output_option,
    round_limits,
    rounds_option,
    stamped_run_dir,
)
from tuner.errors import UsageError
from tuner.measure.exe import find_bin_dir

_CI_TARGET = 1.0  # percent: `tuner search --ci-target`'s default, the stop rule of the rounds past --min-rounds


@click.command()
@build_option("Build (or bin) directory of a tuner-patched build (`tuner build` prints it).", required=True)
@click.option("--model", required=True, type=EXISTING_FILE, help="GGUF model.")
@click.option(
    "--rules",
    multiple=True,
    required=True,
    help="GGML_TUNER_FA_RULES of one candidate, e.g. 'decode:16384-=TILE' (repeatable: one candidate each).",
)
@click.option("--depths", default="0,32768", show_default=True, callback=depths_option, help="KV depths.")
@click.option(
    "--phase", type=click.Choice(["tg", "pp"]), default="tg", show_default=True, help="Decode (tg) or prefill (pp)."
)
@number_option("--pp", click.IntRange(1, 1 << 16), default=512)
@number_option("--tg", click.IntRange(1, 1 << 16), default=128)
@rounds_option()
@number_option("--min-rounds", click.IntRange(2, 100), "Paired interleaved rounds.", default=3)
@click.option(
    "--max-rounds",
    type=click.IntRange(2, 100),
    help="Further rounds, up to this many, go only to the depths where a paired 95% CI is still wider than "
    "±1% (the search's --ci-target). Default: --min-rounds (fixed).",
)
@number_option("--reps", click.IntRange(1, 1000), "llama-bench repetitions per call.", default=3)
@click.option(
    "--era",
    type=click.Choice(["mma"]),
    default="mma",
    show_default=True,
    help="The FA rules hook exists in the era-mma tree only.",
)
@output_option(
    "out_dir", type=DIR, help="Run directory for the logs (default $TUNER_HOME/runs/ab-<time>).", in_place=True
)
def ab(
    build_dir: Path,
    model: Path,
    rules: tuple[str, ...],
    depths: tuple[int, ...],
    phase: str,
    pp: int,
    tg: int,
    rounds: int | None,
    min_rounds: int,
    max_rounds: int | None,
    reps: int,
    era: str,
    out_dir: Path | None,
) -> None:
    """Compare upstream's kernel choice with forced FA rules on one build: paired, interleaved rounds
    (order rotated), one compare table per rule (t/s, Speedup, 95% CI, A/A noise, verdict per depth), judged
    as the search judges: the A/A noise of upstream against the same kernel forced, at least the phase's floor.

    Example: tuner ab --build BUILD --model M.gguf --rules decode:16384-=TILE --depths 0,32768
    """
    from tuner.measure.paired import NOISE_CEILING_PCT
    from tuner.plan.fa_rules import parse_fa_rules, rules_env
    from tuner.result.tables import compare_table, method_paragraph
    from tuner.rounds.compose import judge_phase
    from tuner.rounds.joint import Candidate, run_phase_rounds
    from tuner.rounds.live import make_live_measure
    from tuner.rounds.stats import AA_NAME, UPSTREAM, summarize_phase

    low, high = round_limits(click.get_current_context(), rounds, min_rounds, max_rounds)
    high = high or low
    bin_dir = find_bin_dir(build_dir)
    # Bad syntax or a kernel other than VEC/TILE/MMA: one paragraph, exit 2. The hook gets the parsed
    # rules written back canonically: the C++ side does not strip the spaces the parser tolerates.
    rules = tuple(rules_env(parse_fa_rules(r)) for r in rules)
    # the build's GPU backend carries tuner's FA rules hook where the env name is in its binary
    libs = [*bin_dir.glob("libggml-cuda.so*"), *bin_dir.glob("libggml-hip.so*")]
    if not any(lib.is_file() and b"GGML_TUNER_FA_RULES" in lib.read_bytes() for lib in libs):
        raise UsageError(
            f"{bin_dir} has no tuner FA rules hook (a CPU build, an unpatched llama.cpp or the 2025 rocWMMA "
            "tree), so a rule cannot change its kernel and nothing was measured. Build one with "
            "`tuner build --arch <your GPU>` and pass its bin directory."
        )
    cands = [Candidate(name=UPSTREAM), Candidate(name=AA_NAME)]
    cands += [Candidate(name=f"B{i + 1}", env={"GGML_TUNER_FA_RULES": r}) for i, r in enumerate(rules)]
    run = out_dir or stamped_run_dir("ab")
    measure = make_live_measure(
        bin_dir, model, pp=pp, tg=tg, reps={"pp": reps, "tg": reps}, log_dir=run / "logs", era=era, arch=None
    )
    recs: list[dict[str, Any]] = []
    how = f"{low} rounds" if high == low else f"{low} to {high} rounds"
    log.info(f"tuner ab: {len(cands)} candidates x {how} at depths {list(depths)} ({phase}); logs in {run}")
    run_phase_rounds(
        measure, phase, cands, list(depths), recs, min_rounds=low, max_rounds=high, target_ci=_CI_TARGET, tag="ab"
    )
    # judged as the search judges: the A/A pair, at least the phase's noise floor, the noise ceiling
    cells = judge_phase(phase, summarize_phase(phase, recs, list(depths)))
    n_tok = pp if phase == "pp" else tg
    for i, r in enumerate(rules):
        name = f"B{i + 1}"
        pts = []
        for d, c in cells.items():
            e = c.effects.get(name)
            ts = c.levels.get(name, {}).get("ts") if e else None
            pts.append(
                {
                    "phase": phase,
                    "depth": d,
                    "test": f"{phase}{n_tok}",
                    "base_ts": c.upstream_ts,
                    "tuned_ts": ts,
                    "ci_low": e.ci_low if e else None,
                    "ci_high": e.ci_high if e else None,
                    "aa_noise_pct": c.bar_pct,
                    "noise_kind": "A/A",
                    "verdict": c.verdicts.get(name, "fell back") if e else "fell back",
                    "upstream_kernel": c.upstream_kernel,
                    "kernel": c.kernels.get(name),
                }
            )
        table = compare_table(pts, name_a="upstream", name_b=name, model=model.name)
        click.echo(f"{name}: {r}\n\n" + table + "\n")
    log.info(
        method_paragraph(
            "paired rounds",
            rounds=[sum(1 for r in recs if str(d) in r["values"].get(UPSTREAM, {})) for d in depths],
            ceiling_pct=NOISE_CEILING_PCT,
            rule="sequential",  # compose.judge_phase's default: the verdicts above are the decision rule's
            noise="A/A: upstream against the same kernel forced, in the same rounds (its CI's reach), "
            "at least the phase's median A/A noise.",
        )
    )
