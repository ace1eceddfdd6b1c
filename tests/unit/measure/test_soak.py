"""The long-run stability rule on synthetic series, and run_soak's plumbing on a real llama-bench log.

Synthetic series are built from the tolerances (a decline of twice the allowed drop, a leak of twice
the allowed growth) plus seeded noise, so no measured number is typed in. tests/data/soak/ holds a real
``llama-bench --progress`` soak log of the cached CPU build with the `tiny` model (paths shortened).
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

import tuner._run
from tuner._run import RunResult
from tuner.errors import UsageError
from tuner.measure.bench import parse_bench_jsonl
from tuner.measure.soak import DEFAULT_TOLERANCES, MIN_REPS, judge_soak, plan_chunks, run_soak

DATA = Path(__file__).resolve().parents[2] / "data" / "soak"
T = DEFAULT_TOLERANCES
BASE = 100.0
N = 40  # repetitions: a 10k-token soak in 256-token chunks


def _noisy(values: list[float], rel: float, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    return [v * (1 + rng.uniform(-rel, rel)) for v in values]


def test_flat_noisy_run_passes() -> None:
    j = judge_soak(_noisy([BASE] * N, T.max_drop_pct / 100), tokens_per_sample=256, host_mib=[BASE] * (N - 1))
    assert j.passed and j.reasons == ()
    assert j.slope_ci_pct_per_1k[0] < 0 < j.slope_ci_pct_per_1k[1]
    assert j.host_growth_mib == 0


def test_steady_decline_beyond_tolerance_fails() -> None:
    total = 2 * T.max_drop_pct / 100  # twice the allowed drop over the run
    ts = _noisy([BASE * (1 - total * i / (N - 1)) for i in range(N)], T.max_drop_pct / 400)
    j = judge_soak(ts, tokens_per_sample=256)
    assert not j.passed and j.drop_pct > T.max_drop_pct and j.slope_ci_pct_per_1k[1] < 0
    assert "t/s fell" in j.reasons[0] and "tolerance" in j.reasons[0]


def test_decline_within_tolerance_passes() -> None:
    total = T.max_drop_pct / 200  # half the allowed drop
    j = judge_soak([BASE * (1 - total * i / (N - 1)) for i in range(N)], tokens_per_sample=256)
    assert j.passed and 0 < j.drop_pct < T.max_drop_pct and j.slope_pct_per_1k < 0


def test_one_slow_repetition_is_not_degradation() -> None:
    # a shared machine: one late repetition far slower, no trend
    ts = _noisy([BASE] * N, 0.01)
    ts[-1] = BASE * (1 - 6 * T.max_drop_pct / 100)
    j = judge_soak(ts, tokens_per_sample=256)
    assert j.passed, j.reasons


def test_big_but_untrended_difference_is_noise() -> None:
    # the last window happens to be slow, but the slope's interval still holds zero: not judged a trend
    ts = _noisy([BASE] * MIN_REPS, 0.02, seed=3)
    ts[-3:] = [x * (1 - 2 * T.max_drop_pct / 100) for x in ts[-3:]]
    ts[1] *= 1 - 4 * T.max_drop_pct / 100
    j = judge_soak(ts, tokens_per_sample=256)
    assert j.drop_pct > T.max_drop_pct and j.slope_ci_pct_per_1k[1] >= 0 and j.passed


def test_host_and_device_leaks_fail() -> None:
    grow = [BASE + 2 * T.max_host_growth_mib * i / (N - 2) for i in range(N - 1)]
    j = judge_soak([BASE] * N, tokens_per_sample=256, host_mib=grow, device_mib=grow)
    assert not j.passed and len(j.reasons) == 2
    assert j.reasons[0].startswith("Host memory grew") and j.reasons[1].startswith("Device memory grew")


def test_transient_memory_spike_is_not_a_leak() -> None:
    host = [BASE] * (N - 1)
    host[N // 2] += 4 * T.max_host_growth_mib
    j = judge_soak([BASE] * N, tokens_per_sample=256, host_mib=host, device_mib=[math.nan] * (N - 1))
    assert j.passed and j.host_growth_mib == 0 and math.isnan(j.device_growth_mib)


def test_too_few_samples_fail() -> None:
    j = judge_soak([BASE] * (MIN_REPS - 1), tokens_per_sample=256)
    assert not j.passed and f"at least {MIN_REPS}" in j.reasons[0]


@pytest.mark.parametrize("n", [1, 7, 100, 600, 1000, 10000, 12345])
def test_plan_covers_the_tokens(n: int) -> None:
    c, reps = plan_chunks(n)
    assert c * reps >= n and reps >= MIN_REPS and c >= 1


@pytest.mark.parametrize("n", [0, -5, True, 2.5])
def test_bad_length_is_usage_error(n) -> None:
    with pytest.raises(UsageError, match="positive"):
        plan_chunks(n)


def _fake_bench(tmp_path: Path) -> Path:
    exe = tmp_path / "bin" / "llama-bench"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    return exe.parent


def test_bad_input(tmp_path: Path) -> None:
    bin_dir = _fake_bench(tmp_path)
    with pytest.raises(UsageError, match="does not exist"):
        run_soak(bin_dir, tmp_path / "none.gguf", 100, log_dir=tmp_path)
    (tmp_path / "m.gguf").write_bytes(b"")
    with pytest.raises(UsageError, match="set by the soak"):
        run_soak(bin_dir, tmp_path / "m.gguf", 100, args=["-r", "2"], log_dir=tmp_path)
    with pytest.raises(UsageError, match="positive"):
        run_soak(bin_dir, tmp_path / "m.gguf", 0, log_dir=tmp_path)


def _replay(text: str, rc: int = 0):
    def fake_run(cmd, *, on_line=None, log_file=None, **_kw):
        log_file.write_text(text)
        for line in text.splitlines()[1:]:
            on_line(line)
        return RunResult(returncode=rc, output="", seconds=0.0, log_file=log_file)

    return fake_run


def test_real_log_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (DATA / "cpu-tiny-6x200.log").read_text()
    rec = parse_bench_jsonl(text)[0]
    monkeypatch.setattr(tuner._run, "run", _replay(text))
    (tmp_path / "m.gguf").write_bytes(b"")
    res = run_soak(_fake_bench(tmp_path), tmp_path / "m.gguf", rec["n_gen"] * len(rec["samples_ts"]), log_dir=tmp_path)
    assert res.samples_ts == tuple(rec["samples_ts"]) and res.chunk == rec["n_gen"]
    assert res.generated >= res.n_tokens and res.reps == len(rec["samples_ts"])
    assert [m.rep for m in res.memory] == list(range(1, res.reps))  # one sample per finished repetition but the last
    assert res.error == "" and res.judgement is not None and math.isfinite(res.judgement.drop_pct)


def test_failed_run_is_a_failed_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tuner._run, "run", _replay("$ llama-bench\nerror: invalid parameter for argument: --x\n", rc=1))
    (tmp_path / "m.gguf").write_bytes(b"")
    res = run_soak(_fake_bench(tmp_path), tmp_path / "m.gguf", 100, log_dir=tmp_path)
    assert not res.passed and res.samples_ts == ()
    assert "invalid parameter" in res.reasons[0] and str(res.log_file) in res.reasons[0]
    assert res.summary.startswith("FAIL")
