"""The MMQ-vs-cuBLAS sweep: choice text, matcher and plan (composition: test_sweep_mmq_live.py)."""

from __future__ import annotations

import pytest

from tests.oracles import match_mmq, parse_mmq_choices
from tuner.errors import TunerError, UsageError
from tuner.sweep.mmq import MMQ_BATCHES, MMQ_TYPES, MmqChoice, mmq_dry_run_text, mmq_env, plan_mmq
from tuner.targets.archs import load_arch

SM90 = load_arch("sm_90")

PLANTED = (
    MmqChoice(type="q4_K", lo=1024, hi=None, backend="BLAS"),
    MmqChoice(type="q8_0", lo=256, hi=2048, backend="BLAS"),
    MmqChoice(type="iq4_xs", lo=0, hi=64, backend="BLAS"),
)


def test_choice_text_round_trips() -> None:
    text = mmq_env(PLANTED)
    assert text == ",".join(c.text for c in PLANTED)
    assert parse_mmq_choices(text) == PLANTED
    assert parse_mmq_choices(",," + text + ",") == PLANTED  # empty entries are skipped, as the hook does


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("q4_K:1024-=BLAS", "is not"),
        ("q4_K:..=BLAS", "is not"),
        ("q4_K:1...3=MMQ", "is not"),
        ("q4_K:0..=cublas", "is not"),
        (" q4_K:0..=BLAS", "is not"),
        ("f16:0..=BLAS", "no type MMQ supports"),
        ("q4_k:0..=BLAS", "no type MMQ supports"),
        ("q4_K:512..512=BLAS", "must be greater"),
    ],
)
def test_bad_choice_text_is_refused(text: str, why: str) -> None:
    with pytest.raises(UsageError, match=why):
        parse_mmq_choices(text)


def test_match_takes_the_first_covering_entry() -> None:
    choices = parse_mmq_choices("q4_K:0..512=MMQ,q4_K:256..=BLAS")
    assert [match_mmq(choices, "q4_K", n) for n in (0, 511, 512, 1 << 40)] == ["MMQ", "MMQ", "BLAS", "BLAS"]
    assert match_mmq(choices, "q6_K", 512) is None


def test_mmq_plan_counts() -> None:
    cells = plan_mmq(SM90)
    assert len(cells) == len(MMQ_TYPES) * len(MMQ_BATCHES)
    assert MMQ_BATCHES[0] == 16 and MMQ_BATCHES[-1] == 4096
    assert {c.configs for c in cells} == {("default", "A/A", "BLAS")}
    text = mmq_dry_run_text(cells, limits=(4, 4), sizes=[(4096, 4096), (896, 896)], per_call_s=0.1)
    assert (
        "6 types x 2 sizes x 9 batch sizes = 72 cases a config (4 type/size pairs skipped" in text
    )  # 4 of 6 types need k % 256
    assert "sizes m x k: 4096x4096, 896x896" in text and "not runnable" not in text
    assert "3 processes a round" in text and "x 4 rounds = 12 processes, 864 cases; estimated" in text
    assert "time at 0.1 s per case (what-if): 1.4 min" in text
    with pytest.raises(TunerError, match="not supported"):
        plan_mmq(SM90, types=["f16"])
