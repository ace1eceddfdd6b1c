"""A search whose tune trial the confirm measured and then dropped reports those rounds (not "nothing was
re-measured"), its closing line names the trial and why it went, and the advice it prints, followed, measures
again (a new study), where rerunning the same command measures nothing new."""

from __future__ import annotations

import dataclasses
import random
import types
from typing import Any

import optuna

from tests.unit.search.conftest import search_run
from tuner.plan.space import load_space
from tuner.result.pipeline_export import summary_line
from tuner.result.pipeline_report import fresh_study_advice, noisy_line, report_text
from tuner.search import confirm as conf
from tuner.search.context import Proposal
from tuner.study.record import SearchOutcome, StudyHeader, TrialSummary, TunedTrial

TUNED = TunedTrial(trial=0, values={"ubatch": 128, "flash_attn": "off"}, params={"ubatch": 128, "flash_attn": "off"})


def _cfg() -> Any:
    return types.SimpleNamespace(
        min_rounds=3, max_rounds=3, ci_target=1.0, pp=256, tg=64, variants=("cpu",), depths=(0, 1024), confirm_extra=0
    )


def _noisy_factory(calls: list[str]) -> Any:
    rng = random.Random(1)

    def measure(c: Any, phase: str, depths: Any, label: str) -> dict[int, dict[str, Any]]:
        calls.append(label)  # a busy 2-core machine: any call can take 2-10x longer than the one before
        return {d: {"ts": 100.0 * rng.uniform(0.1, 1.0), "kernel": None, "why": None, "error": ""} for d in depths}

    return lambda build: measure


def _confirm(study: Any, calls: list[str]) -> SearchOutcome:
    build = types.SimpleNamespace(build_id="b0", meta={}, bin_dir=None)
    builds = types.SimpleNamespace(get=lambda variant, cv: build)
    run = search_run(_cfg(), study, space=load_space("cpu", "mma"), builds=builds, factory=_noisy_factory(calls))
    return conf.run_confirm(run, Proposal(rules=(), tuned=TUNED))


def _header(name: str) -> StudyHeader:
    return StudyHeader(
        name=name,
        arch="cpu",
        source_spec="pypi:llama-cpp-python==0.3.36",
        commit="0c1e570",
        era="mma",
        model="/m/smollm2-135m-q4_k_m.gguf",
        pp=256,
        tg=64,
        depths=(0, 1024),
        shape={"head_dim": 64, "gqa": 3, "n_layers": 30},
    )


def test_a_dropped_trials_confirm_rounds_are_kept_and_reported() -> None:
    calls: list[str] = []
    res = _confirm(optuna.create_study(study_name="noisy"), calls)
    assert res.tuned is None and res.rows == ()  # dropped: the export is upstream's
    kd = res.knobs_dropped
    assert kd is not None
    assert kd["trial"] == 0 and sorted(kd["phases"]) == ["pp", "tg"] and "ceiling" in kd["why"]
    assert {(r["phase"], r["depth"]) for r in kd["rows"]} == {("tg", 0), ("tg", 1024), ("pp", 0), ("pp", 1024)}
    assert all(r["rounds"] == 3 for r in kd["rows"]) and len(calls) == 2 * 3 * 3  # 3 candidates, 3 rounds, 2 phases

    outcome = dataclasses.replace(
        res,
        header=_header("noisy"),
        trials=(
            TrialSummary(
                number=0, status="complete", objectives=(6.5, 5.9), params={}, phases=("pp", "tg"), reason=None
            ),
        ),
    )
    text = report_text(outcome)
    assert "not re-measured" not in text and "nothing was re-measured" not in text
    assert "The confirm measured tune trial 0's knobs" in text and "3 paired round(s)" in text
    assert all(f"{p}@d{d}" in text for p in ("tg", "pp") for d in (0, 1024))
    line = summary_line(outcome)
    assert "no forced kernel or knob beat upstream" not in line
    assert "tune trial 0" in line and "pp x6.50 / tg x5.90" in line and "dropped it" in line and "ceiling" in line
    # stored and read back: the export's config and report come from the stored result
    again = SearchOutcome.from_result(_header("noisy"), outcome.result_json())
    assert again.knobs_dropped == outcome.knobs_dropped


def test_the_advice_followed_measures_again_and_the_plain_rerun_does_not() -> None:
    calls: list[str] = []
    storage = optuna.storages.InMemoryStorage()
    _confirm(optuna.create_study(study_name="noisy", storage=storage), calls)
    first = len(calls)
    # the same command resumes the same study: every confirm round is stored, nothing is measured
    _confirm(optuna.load_study(study_name="noisy", storage=storage), calls)
    assert len(calls) == first
    advice = fresh_study_advice("noisy")
    assert "--study noisy-2" in advice and "measures nothing new" in advice
    # followed: a new study of that name measures every round again
    _confirm(optuna.create_study(study_name="noisy-2", storage=storage), calls)
    assert len(calls) == 2 * first


def test_the_search_command_takes_the_advised_flag() -> None:
    import re

    import click

    from tuner.cli import cli

    flag = re.search(r"`(--[a-z-]+) noisy-2`", fresh_study_advice("noisy"))
    assert flag is not None
    search = cli.get_command(click.Context(cli), "search")
    assert search is not None and any(flag.group(1) in p.opts for p in search.params)


def test_the_noisy_first_line_gives_the_working_advice() -> None:
    rows = [{"phase": "tg", "depth": 0, "verdict": "too noisy", "aa_noise_pct": 150.0, "base_ts": 1.0, "tuned_ts": 1.0}]
    outcome = SearchOutcome(header=_header("busy"), rows=tuple(rows))
    line = noisy_line(outcome)
    assert "--study busy-2" in line and "--max-rounds" not in line and "(it resumes)" not in line
