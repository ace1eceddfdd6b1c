"""The soak on the real CPU build with the `tiny` model, and `tuner validate --soak` on the stored CPU result.

A 1200-token soak is 6 repetitions of tg200 in one llama-bench process (about 7 s on 2 cores); the
CLI run soaks results/cpu/tiny-f16 with 600 tokens after its static checks (about 15 s when the build
is cached). The tolerances are the module's defaults: on a 2-core box shared with other jobs single
repetitions dip by tens of percent, which the rule's trend requirement must not call a degradation.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.measure.soak import DEFAULT_TOLERANCES, MIN_REPS, run_soak

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CPU_RESULT = REPO / "results" / "cpu" / "tiny-f16"


def _tuner(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TUNER_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )


def test_soak_on_the_cpu_build(cpu_build, tiny_model: Path, tmp_path: Path) -> None:
    res = run_soak(cpu_build.bin_dir, tiny_model, 1200, {}, ["-t", "2"], tmp_path)
    assert res.error == "" and res.generated >= 1200 and len(res.samples_ts) == res.reps >= MIN_REPS
    assert all(x > 0 for x in res.samples_ts)
    # one RSS sample per finished repetition but the last, all read from the live llama-bench process
    assert [m.rep for m in res.memory] == list(range(1, res.reps))
    assert all(m.host_rss_mib > tiny_model.stat().st_size / 2**20 / 2 for m in res.memory)
    j = res.judgement
    assert j is not None and j.host_growth_mib <= DEFAULT_TOLERANCES.max_host_growth_mib, res.summary
    # no leak; a t/s verdict can only fail on a trend (a neighbour job starting mid-run looks like one)
    assert res.passed or all(r.startswith("t/s fell") for r in res.reasons), res.summary
    assert res.log_file.is_file() and "--progress" in res.log_file.read_text().splitlines()[0]


def test_failed_soak_is_data(cpu_build, tiny_model: Path, tmp_path: Path) -> None:
    res = run_soak(cpu_build.bin_dir, tiny_model, 60, {}, ["--no-such-flag"], tmp_path)
    assert not res.passed and "--no-such-flag" in res.reasons[0]


def test_validate_soak_on_the_stored_cpu_result(cpu_build, tiny_model: Path, tuner_home: Path) -> None:
    # the result names its model file; the test cache holds it under $TUNER_HOME/models
    assert (tuner_home / "models" / tiny_model.name).is_file()
    res = _tuner("validate", str(CPU_RESULT), "--soak", "600", home=tuner_home)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "ok  soak" in res.stdout and "PASS: 600 tokens" in res.stdout


def test_validate_soak_bad_input(tiny_model: Path, tuner_home: Path, tmp_path: Path) -> None:
    for args, words in (
        (["--soak", "0"], "positive number of tokens"),
        (["--soak", "100", "--model", str(tmp_path / "none.gguf")], "does not exist"),
    ):
        res = _tuner("validate", str(CPU_RESULT), *args, home=tuner_home)
        assert res.returncode == 2, res.stdout + res.stderr
        assert (
            res.stderr.startswith("tuner: error:") and words in res.stderr and len(res.stderr.strip().splitlines()) == 1
        )
    # a result whose model is nowhere on this machine needs --model
    copy = tmp_path / "cpu" / "tiny-f16"
    shutil.copytree(CPU_RESULT, copy)
    cfg = copy / "config.toml"
    cfg.write_text(cfg.read_text().replace(f'file = "{tiny_model.name}"', 'file = "absent.gguf"'))
    res = _tuner("validate", str(copy), "--soak", "100", home=tuner_home)
    assert res.returncode == 2 and "--model PATH" in res.stderr, res.stdout + res.stderr
