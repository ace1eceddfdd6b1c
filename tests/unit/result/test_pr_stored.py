"""PR.md rendered from a stored result's own data (results/sm_90/llama-3.2-1b-q4_k_m/config.toml): every item
of what a pull-request body must get right (issue 27, point 4)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tuner._compat import tomllib
from tuner.plan.fa_rules import FaRule, rules_from_texts
from tuner.result.pipeline_export import pr_body
from tuner.result.pipeline_report import confirmed_points
from tuner.study.record import StudyHeader

RESULT = Path(__file__).resolve().parents[3] / "results" / "sm_90" / "llama-3.2-1b-q4_k_m"


def _attrs() -> tuple[StudyHeader, tuple[FaRule, ...], list[dict], dict]:
    cfg = tomllib.loads((RESULT / "config.toml").read_text())
    h = StudyHeader(
        name="x",
        arch=cfg["target"]["arch"],
        device=cfg["target"]["measured_on"],
        model=cfg["model"]["file"],
        commit=cfg["source"]["commit"],
        pp=cfg["model"]["pp"],
        tg=cfg["model"]["tg"],
        shape=cfg["model"]["shape"],
        depths=tuple(cfg["model"]["depths"]),
    )
    return h, rules_from_texts(cfg["choice"]["fa_rules"]), confirmed_points(cfg["points"], h.pp, h.tg), cfg["defines"]


def _table(md: str) -> list[list[str]]:
    lines = md.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("| Model "))
    out = []
    for ln in lines[head:]:
        if not ln.startswith("|"):
            break
        out.append([c.strip() for c in ln.strip().strip("|").split("|")])
    return [out[0]] + out[2:]


@pytest.fixture(scope="module")
def md() -> str:
    a, rules, points, defines = _attrs()
    return pr_body(a, rules, points, defines=defines, like="llama-3.2-1b", weight_type="q4_k_m")


def test_depth_in_every_test_name(md: str) -> None:
    head, *rows = _table(md)
    tests = [r[head.index("Test")] for r in rows]
    assert len(tests) == 16 and len(set(tests)) == 16
    assert all(re.fullmatch(r"(pp512|tg128)(@d\d+)?", t) for t in tests)
    assert "tg128@d4096" in tests and "tg128@d65536" in tests and "pp512@d32768" in tests


def test_speedup_is_the_ratio_of_the_shown_t_s(md: str) -> None:
    head, *rows = _table(md)
    a, b, sp = head.index("t/s upstream"), head.index("t/s patched"), head.index("Speedup")
    for r in rows:
        assert r[sp] == f"{float(r[b]) / float(r[a]):.2f}", r
    d4096 = next(r for r in rows if r[1] == "tg128@d4096")
    assert (d4096[a], d4096[b], d4096[sp]) == ("785.76", "803.99", "1.02")  # was 1.00 beside these numbers


def test_method_is_the_one_that_computed_the_numbers(md: str) -> None:
    from tuner.result.tables import method_paragraph

    assert "geometric mean of the per-round ratios" in md and "Student-t" in md
    assert "bootstrap" not in md and "ratio of the median" not in md
    assert method_paragraph("paired rounds", rounds=[3, 5, 6])[:80] in md.replace("\n", " ")
    head, *rows = _table(md)
    faster = [r for r in rows if "faster" in r[head.index("Verdict")]]
    assert [r[1] for r in faster] == ["tg128@d32768", "tg128@d49152", "tg128@d65536"]
    assert all("A/A" in r[head.index("Noise")] for r in rows)


def test_models_note_says_random_weights(md: str) -> None:
    models = md.split("## Models")[1].split("## ")[0]
    assert "synthetic random weights" in models and "llama-3.2-1b" in models and "head dim 64" in models
    assert "does not show" in models and "output quality" in models


def test_reproduce_on_stock_llama_cpp(md: str) -> None:
    repro = md.split("## Reproduce")[1]
    assert "git checkout 0c1e57098" in repro and "git apply ../upstream.patch" in repro
    assert "build-a/bin/llama-bench" in repro and "build-b/bin/llama-bench" in repro
    assert "-d 0,4096,8192,12288,16384,32768,49152,65536" in repro
    assert "tuner compare a.jsonl b.jsonl --aa a.jsonl a2.jsonl" in repro
    assert "tuner model synth --like llama-3.2-1b --quant Q4_K_M" in repro
    assert (
        "tuner search --arch sm_90 --like llama-3.2-1b --quant Q4_K_M --depths 0,4096,8192,16384,32768,65536" in repro
    )
    assert "GGML_TUNER" not in md
    assert not re.search(r"(^|[\s=:'\"])/(work|home|root|tmp|Users)/", md)
    assert "sqlite:" not in md and ".devhome" not in md
