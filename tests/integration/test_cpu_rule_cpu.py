"""Seed 004 §21.3 on the real CPU build: a scheduling change that burns CPU without speed is rejected.

The tiny model decodes at ~150 t/s on one thread. The candidate oversubscribes two CPUs: three threads
held to CPUs 0-1 (``-t 3 -C 0x3 --cpu-strict 1``: ggml pins them to CPUs 0, 1, 0) with OpenMP
busy-waiting (``OMP_WAIT_POLICY=ACTIVE``), so it takes two CPUs' time for one CPU's speed on any host
with three or more CPUs (three threads on three free CPUs, as this test first had it, may well be
faster there, and would then rightly be kept). The CPU build uses OpenMP (``GGML_OPENMP=ON``, the default),
so llama-bench's ``--poll`` does nothing here: ggml's own threadpool, which it tunes, is not used for
the compute; the OpenMP runtime's wait policy is the same knob. Measured on this project's 2-core box
with ``-C 0x3``, before tuner refused -t above the CPU count (3 rounds, tg32): upstream ``-t 1``
99-100% CPU, 131-178 t/s; the candidate 181-185% CPU, 154-184 t/s (per-round ratios 0.93-1.05).
``--poll 100`` vs ``--poll 0`` at ``-t 2``: 195-196% vs 194-195% (no difference). About 30 s.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from tuner.measure.observe import find_gpu_probe
from tuner.measure.paired import CPU_REJECTED
from tuner.plan.fa_rules import parse_fa_rules
from tuner.rounds import compose as comp
from tuner.rounds.joint import Candidate, run_phase_rounds
from tuner.rounds.live import make_live_measure
from tuner.rounds.stats import AA_NAME, UPSTREAM, summarize_phase
from tuner.search import confirm as conf

pytestmark = pytest.mark.integration

ONE = ("-t", "1")
HUNGRY = Candidate(
    name=conf.FINAL, env={"OMP_WAIT_POLICY": "ACTIVE"}, args=("-t", "3", "-C", "0x3", "--cpu-strict", "1")
)


# tuner refuses -t above the machine's CPUs (issue 17's bad-input rule), so the oversubscribed candidate
# needs 3 CPUs; on 2 (this project's CI box) `-t 2` instead came out faster beyond the ±25% A/A noise and is rightly kept.
@pytest.mark.skipif(
    (os.cpu_count() or 1) < 3,
    reason="the CPU-hungry candidate runs 3 threads; this machine has fewer "
    "than 3 CPUs and tuner refuses -t above the CPU count",
)
def test_cpu_hungry_decode_change_is_rejected(cpu_build, tiny_model: Path, tmp_path: Path) -> None:
    measure = make_live_measure(
        cpu_build.bin_dir,
        tiny_model,
        pp=0,
        tg=32,
        reps={"pp": 2, "tg": 3},
        log_dir=tmp_path / "logs",
        era="mma",
        arch="cpu",
    )
    cands = [Candidate(name=UPSTREAM, args=ONE), Candidate(name=AA_NAME, args=ONE), HUNGRY]
    recs: list = []
    run_phase_rounds(measure, "tg", cands, [0], recs, min_rounds=3, max_rounds=3, target_ci=0.1, tag="confirm")
    assert not any(r["errors"] for r in recs), [r["errors"] for r in recs]
    # the records carry what the observer saw in the timed repetitions; GPU%: None (not 0) without a GPU
    # observer, else the idle device's utilization (on the H100 host this ran with NVML present)
    assert all(r["cpu"][UPSTREAM]["0"] > 30 and r["core"][conf.FINAL]["0"] > 0 for r in recs)
    probe = find_gpu_probe()
    gpu_seen = probe is not None
    if probe is not None:
        probe.close()
    assert all((r["gpu"][n]["0"] is None) != gpu_seen for r in recs for n in r["gpu"])
    log = next((tmp_path / "logs").glob("confirm-tg-r0-final-tg.log")).read_text()
    assert " --progress " in log.splitlines()[0] and "generation run 2/4" in log  # the marks of the timed windows

    cell = summarize_phase("tg", recs, [0])[0]
    assert cell.cpu[conf.FINAL].ci_low > cell.cpu_noise, (cell.cpu, cell.cpu_noise)  # CPU% up beyond the A/A noise
    assert cell.verdicts[conf.FINAL] == CPU_REJECTED, (cell.effects, cell.noise_pct, cell.cpu, cell.cpu_noise)
    dec = comp.compose_phase("tg", {0: cell})
    assert dec[0].winner is None and CPU_REJECTED in dec[0].reason  # not composed

    rows = conf.point_rows("tg", {0: cell}, recs)
    assert rows[0]["verdict"] == CPU_REJECTED and rows[0]["tuned_cpu"] > rows[0]["base_cpu"]
    assert math.isnan(rows[0]["base_gpu"]) != gpu_seen
    j = conf.judge(parse_fa_rules("decode:0-=VEC"), rows, process_changed=True)
    assert not j["process_ok"] and j["kept"] == ()  # neither the knobs nor a rule survive; nothing is claimed
