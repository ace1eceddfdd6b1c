"""``tuner equivalence``: the output-equivalence gate (determinism + KLD against upstream's config)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import click

from tuner.cli._params import (
    DIR,
    EXISTING_DIR,
    EXISTING_FILE,
    build_option,
    number_option,
    output_option,
    stamped_run_dir,
)
from tuner.errors import TunerError, UsageError
from tuner.measure.exe import find_bin_dir
from tuner.pairs import parse_pairs


def _split(text: str | None, flag: str) -> list[str]:
    if not text:
        return []
    try:
        return shlex.split(text)
    except ValueError as err:
        raise UsageError(
            f"{flag} {text!r} cannot be split into arguments ({err}). Quote it like a shell line, "
            "e.g. --args '-t 1 -fa on'."
        ) from err


@click.command()
@build_option("The candidate's build (or bin) directory holding llama-perplexity.", required=True)
@click.option(
    "--upstream",
    "upstream_dir",
    type=EXISTING_DIR,
    help="Upstream's build (or bin) directory [default: --build, for env/argument candidates].",
)
@click.option("--model", required=True, type=EXISTING_FILE, help="GGUF model.")
@click.option(
    "--mode",
    type=click.Choice(["prefill", "decode"]),
    default="prefill",
    show_default=True,
    help="prefill: -b N -ub N (prefill kernels); decode: -b 1 -ub 1 (decode kernels, one token per batch).",
)
@click.option(
    "--env",
    "envs",
    multiple=True,
    metavar="NAME=VALUE",
    help="Candidate environment (repeatable), e.g. GGML_TUNER_FA_RULES=decode:0-=MMA.",
)
@click.option("--args", help="Candidate llama-perplexity arguments as one string, e.g. '-t 1 -fa on'.")
@click.option(
    "--upstream-env", "up_envs", multiple=True, metavar="NAME=VALUE", help="Upstream environment (repeatable)."
)
@click.option("--upstream-args", "up_args", help="Upstream llama-perplexity arguments as one string.")
@number_option("--ctx", click.IntRange(16, 1 << 20), "Context per chunk (half is scored).", default=128)
@number_option("--chunks", click.IntRange(1, 10000), "Chunks scored.", default=2)
@click.option(
    "--strict", is_flag=True, help="Scheduling-only candidate: require log-probs byte-identical to upstream's."
)
@click.option("--max-mean-kld", type=click.FloatRange(0), help="Mean KLD threshold [default: calibrated 1e-5].")
@click.option("--max-p99-kld", type=click.FloatRange(0), help="99% KLD threshold [default: calibrated 1e-4].")
@click.option("--min-same-top", type=click.FloatRange(0, 100), help="Same top p threshold in % [default: 98].")
@number_option("--timeout", click.FloatRange(1), "Seconds per llama-perplexity call.", default=1800.0)
@output_option(
    "out_dir",
    type=DIR,
    help="Run directory for logs and log-prob files (default $TUNER_HOME/runs/equivalence-<time>).",
    in_place=True,
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def equivalence(
    build_dir: Path,
    upstream_dir: Path | None,
    model: Path,
    mode: str,
    envs: tuple[str, ...],
    args: str | None,
    up_envs: tuple[str, ...],
    up_args: str | None,
    ctx: int,
    chunks: int,
    strict: bool,
    max_mean_kld: float | None,
    max_p99_kld: float | None,
    min_same_top: float | None,
    timeout: float,
    out_dir: Path | None,
    as_json: bool,
) -> None:
    """Check that a candidate config computes the same model output as upstream's.

    Runs llama-perplexity on upstream (saving its log-probabilities), the candidate twice (its two
    files must be byte-identical: determinism) and the candidate with --kl-divergence against
    upstream's file; the candidate passes when mean KLD, 99% KLD and "Same top p" are within the
    thresholds. Exit 0 on pass, 1 on fail (the reason and the log paths are printed).
    """
    from tuner.measure.equivalence import DEFAULT_THRESHOLDS, Thresholds, run_equivalence

    cand = find_bin_dir(build_dir, "llama-perplexity")
    up = find_bin_dir(upstream_dir, "llama-perplexity") if upstream_dir is not None else cand
    d = DEFAULT_THRESHOLDS
    thr = Thresholds(
        mean_kld=d.mean_kld if max_mean_kld is None else max_mean_kld,
        p99_kld=d.p99_kld if max_p99_kld is None else max_p99_kld,
        same_top_pct=d.same_top_pct if min_same_top is None else min_same_top,
    )
    res = run_equivalence(
        cand,
        up,
        model,
        mode=mode,
        candidate_env=parse_pairs(envs, "--env", "GGML_TUNER_FA_RULES=decode:0-=MMA"),
        candidate_args=_split(args, "--args"),
        upstream_env=parse_pairs(up_envs, "--upstream-env", "GGML_TUNER_FA_LOG=1"),
        upstream_args=_split(up_args, "--upstream-args"),
        work_dir=out_dir or stamped_run_dir("equivalence"),
        ctx=ctx,
        chunks=chunks,
        strict=strict,
        thresholds=thr,
        timeout=timeout,
    )
    if as_json:
        click.echo(json.dumps(res.as_dict(), indent=2, sort_keys=True))
    else:
        click.echo(res.summary)
        for step, path in res.logs.items():
            click.echo(f"  {step} log: {path}")
    if not res.passed:
        raise TunerError(
            f"Output-equivalence gate failed ({res.mode}): {' '.join(res.reasons)} "
            "A candidate that fails this gate is infeasible and is never exported."
        )
