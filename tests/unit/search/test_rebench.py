"""``validate --bench`` re-measures a result's claims in paired rounds (measure replaced by a fake here;
the real measure is the search's own, exercised by the CPU search tests and the H100 runs)."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from tuner.result.checks import load_toml_in
from tuner.search.rebench import rebench

SM90 = Path(__file__).resolve().parents[3] / "results" / "sm_90" / "llama-3.2-1b-q4_k_m"


@pytest.fixture()
def fake_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    seen: dict = {"gain": 1.0, "envs": []}
    rng = random.Random(7)
    monkeypatch.setattr("tuner.plan.render.render_variant", lambda *a, **k: "rv")
    monkeypatch.setattr("tuner.builder.cmake.build_variant", lambda rv: SimpleNamespace(bin_dir=tmp_path))

    def make(bin_dir, model, **kw):
        def measure(cand, phase, depths, label):
            seen["envs"].append(dict(cand.env))
            gain = seen["gain"] if cand.name == "tuned" else 1.0
            return {
                d: {"ts": 100.0 * gain * (1 + rng.gauss(0, 0.005)), "kernel": None, "why": None, "error": ""}
                for d in depths
            }

        return measure

    monkeypatch.setattr("tuner.rounds.live.make_live_measure", make)
    return seen


def _rebench(tmp_path: Path):
    model = tmp_path / "l1b-q4km.gguf"
    model.write_bytes(b"GGUF")
    return rebench(load_toml_in(SM90, "config.toml"), source=SimpleNamespace(era="mma"), model=model, log_dir=tmp_path)


def test_a_claim_that_still_holds_passes(fake_gpu: dict, tmp_path: Path) -> None:
    fake_gpu["gain"] = 1.16
    ok, detail = _rebench(tmp_path)
    assert ok and "tg128@d65536: faster +16" in detail, detail
    # the tuned side runs the result's rules; upstream and its A/A twin run none
    assert {e.get("GGML_TUNER_FA_RULES") for e in fake_gpu["envs"]} == {None, "decode/D64/gqa4/kvf16:32768-=TILE"}


def test_a_claim_that_no_longer_holds_fails(fake_gpu: dict, tmp_path: Path) -> None:
    ok, detail = _rebench(tmp_path)
    assert not ok and "tg128@d65536: no difference" in detail, detail


def test_no_model_is_a_failed_check_that_says_so(tmp_path: Path) -> None:
    ok, detail = rebench(load_toml_in(SM90, "config.toml"), source=SimpleNamespace(era="mma"), model=None)
    assert not ok and "pass --model" in detail
