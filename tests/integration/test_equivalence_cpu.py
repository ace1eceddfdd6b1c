"""The output-equivalence gate on the real CPU build with the `tiny` random-weight model.

llama-perplexity is added on demand to the session's cached CPU build (one TU + link, about 10 s
the first time; the build id must not change). Every gate call runs the real tool 3-4 times on
126 scored tokens, about 5 s each on 2 cores.

The deliberately wrong candidates: a q4_0 KV cache (a runtime config whose numerics really differ;
no build) always runs; a ggml-cpu patch that scales RMS norm by 1.25, built as its own variant through
render -> patch -> build, runs when that build is cached or TUNER_TEST_BUILD_PATCHED=1 (its first
build compiles ggml, llama and common: about 7 minutes on 2 cores).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from tuner.builder.cmake import build_variant, ensure_targets
from tuner.measure.equivalence import run_equivalence

pytestmark = pytest.mark.integration

PERTURBED_FILE = "ggml/src/ggml-cpu/ops.cpp"
PERTURBED_ANCHOR = "const float scale = 1.0f/sqrtf(mean + eps);"


@pytest.fixture(scope="session")
def ppl_bin(cpu_build) -> Path:
    before = cpu_build.build_id
    b = ensure_targets(cpu_build, ["llama-perplexity"])
    assert b.build_id == before and (Path(b.bin_dir) / "llama-perplexity").is_file()
    # added on demand (extra_targets), or carried along as a target by a later build that installed a new
    # folder for the variant (tuner build --targets X keeps the tools the folder had)
    have = [*b.meta["targets"], *b.meta.get("extra_targets", {})]
    assert {"llama-bench", "test-backend-ops", "llama-quantize", "llama-perplexity"} <= set(have)
    return b.bin_dir


def test_extra_target_keeps_the_build_id_and_the_cache(ppl_bin: Path, tree_a, cpu_build) -> None:
    from tuner.plan.render import render_variant

    again = build_variant(
        render_variant(tree_a, "cpu", "cpu", local_archs=[]),
        targets=("llama-bench", "test-backend-ops", "llama-quantize"),
    )
    assert again.cached and again.build_id == cpu_build.build_id and (again.bin_dir / "llama-perplexity").is_file()


def test_upstream_vs_itself_passes_and_threads_are_bitwise_identical(
    ppl_bin: Path, tiny_model: Path, tmp_path: Path
) -> None:
    res = run_equivalence(
        ppl_bin,
        ppl_bin,
        tiny_model,
        candidate_args=["-t", "1"],
        upstream_args=["-t", "2"],
        work_dir=tmp_path,
        strict=True,
    )
    assert res.passed, res.summary
    assert res.deterministic and res.identical_to_upstream
    assert res.stats.mean_kld == 0.0 and res.stats.same_top_pct == 100.0 and res.stats.p99_kld <= 2e-6
    assert all(Path(p).is_file() for p in res.logs.values())


def test_decode_mode_and_fa_off_pass(ppl_bin: Path, tiny_model: Path, tmp_path: Path) -> None:
    res = run_equivalence(
        ppl_bin,
        ppl_bin,
        tiny_model,
        mode="decode",
        candidate_args=["-fa", "off", "-t", "2"],
        upstream_args=["-fa", "on", "-t", "2"],
        work_dir=tmp_path,
    )
    assert res.passed, res.summary
    assert res.identical_to_upstream is False  # another kernel: different bits, same output within the threshold
    assert "-b 1 -ub 1" in Path(res.logs["kld"]).read_text().splitlines()[0]


def test_the_search_spaces_bench_switches_reach_llama_perplexity_as_it_spells_them(
    ppl_bin: Path, tiny_model: Path, tmp_path: Path
) -> None:
    # on the H100 the gate passed llama-bench's `-nkvo 1` as is, and llama-perplexity exited
    # "error: invalid argument: 1". On the CPU backend the KV cache is on the host either way: a pass.
    from tuner.rounds.output_gate import perplexity_args

    args, _ = perplexity_args(["-t", "2", "-nkvo", "1"], "mma")
    res = run_equivalence(
        ppl_bin,
        ppl_bin,
        tiny_model,
        mode="decode",
        candidate_args=args,
        upstream_args=perplexity_args(["-t", "2"], "mma")[0],
        work_dir=tmp_path,
    )
    assert res.passed, res.summary
    assert " -nkvo" in Path(res.logs["candidate-a"]).read_text().splitlines()[0]


def test_quantized_kv_candidate_is_rejected(ppl_bin: Path, tiny_model: Path, tmp_path: Path) -> None:
    res = run_equivalence(
        ppl_bin,
        ppl_bin,
        tiny_model,
        candidate_args=["-ctk", "q4_0", "-ctv", "q4_0", "-t", "2"],
        upstream_args=["-t", "2"],
        work_dir=tmp_path,
    )
    assert not res.passed and res.deterministic
    assert any(r.startswith("Mean KLD") for r in res.reasons) and res.stats.mean_kld > 1e-4
    assert "FAIL (prefill)" in res.summary


def test_failed_run_is_a_failed_gate_with_its_log(ppl_bin: Path, tiny_model: Path, tmp_path: Path) -> None:
    res = run_equivalence(ppl_bin, ppl_bin, tiny_model, candidate_args=["--no-such-flag"], work_dir=tmp_path)
    assert not res.passed and res.deterministic is None
    assert "candidate's run A failed" in res.reasons[0] and str(res.logs["candidate-a"]) in res.reasons[0]


def _perturbed_variant(tree_a):
    from tuner.plan.patch import unified_diff
    from tuner.plan.render import render_variant

    rv = render_variant(tree_a, "cpu", "cpu", local_archs=[])
    old = (Path(tree_a.root) / PERTURBED_FILE).read_text()
    assert old.count(PERTURBED_ANCHOR) == 1
    new = old.replace(
        PERTURBED_ANCHOR, "const float scale = 1.25f/sqrtf(mean + eps); // tuner test: deliberately wrong"
    )
    return dataclasses.replace(rv, patch=unified_diff(PERTURBED_FILE, old, new), files={PERTURBED_FILE: new})


def test_patched_ggml_cpu_variant_is_rejected(ppl_bin: Path, tiny_model: Path, tree_a, tmp_path: Path) -> None:
    from tuner.paths import tuner_home

    rv = _perturbed_variant(tree_a)
    exe = tuner_home() / "builds" / rv.key / "artifacts" / rv.artifact_key / "bin" / "llama-perplexity"
    if not exe.is_file() and os.environ.get("TUNER_TEST_BUILD_PATCHED") != "1":
        pytest.skip(
            "the patched ggml-cpu variant is not built yet; TUNER_TEST_BUILD_PATCHED=1 builds it (~7 min on 2 cores)"
        )
    bad = build_variant(rv, targets=("llama-perplexity",))
    assert (
        bad.build_id
        != build_variant(
            dataclasses.replace(rv, patch="", files={}), targets=("llama-bench", "test-backend-ops", "llama-quantize")
        ).build_id
    )
    res = run_equivalence(
        bad.bin_dir, ppl_bin, tiny_model, candidate_args=["-t", "2"], upstream_args=["-t", "2"], work_dir=tmp_path
    )
    assert not res.passed and res.deterministic, res.summary
    assert res.stats.mean_kld > 10 * res.thresholds.mean_kld
    assert any(r.startswith("Mean KLD") for r in res.reasons)
