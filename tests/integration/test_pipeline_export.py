"""Export of a screen -> compose -> tune -> confirm study, on the real pinned tree.

The study is a real H100 screen (docs/data/noise-floors/sm90-l1b-v2.db.xz); its ``result`` is replaced here by
a CRAFTED confirm outcome (one kept decode rule and its points), because that run never reached its
confirm stage. What is tested is the export, not the numbers.
"""

from __future__ import annotations

import lzma
from pathlib import Path

import pytest

from tuner.errors import UsageError

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RULE = "decode/D64/gqa4/kvf16:65536-=TILE"


def _crafted_rows() -> list[dict]:
    rows = []
    for d, up, tuned, lo, hi, v in (
        (32768, 561.0, 563.0, 0.99, 1.02, "no difference"),
        (49152, 480.0, 481.0, 0.99, 1.02, "no difference"),
        (65536, 402.6, 461.0, 1.11, 1.18, "faster"),
    ):
        rows.append(
            {
                "phase": "tg",
                "depth": d,
                "upstream_kernel": "VEC",
                "kernel": "TILE" if d >= 65536 else "VEC",
                "base_ts": up,
                "tuned_ts": tuned,
                "speedup": tuned / up,
                "ci_low": lo,
                "ci_high": hi,
                "rounds": 4,
                "aa_noise_pct": 4.4,
                "verdict": v,
            }
        )
    return rows


def _crafted_gate(*, passed: bool) -> dict:
    """A gate record shaped like tuner.rounds.output_gate's (CRAFTED numbers: that run had no gate)."""
    mean = 0.0 if passed else 0.006275
    return {
        "verdict": "pass" if passed else "fail",
        "checks": [
            {
                "name": "decode decode/D64/gqa4/kvf16:0-=TILE",
                "mode": "decode",
                "strict": False,
                "passed": passed,
                "verdict": "pass" if passed else "fail",
                "reasons": [] if passed else ["Mean KLD 0.006275 > threshold 1e-05."],
                "deterministic": True,
                "identical_to_upstream": False,
                "why": "kept rule kernel TILE (interval widened to 0-)",
                "stats": {"mean_kld": mean, "p99_kld": 1e-6, "max_kld": 2e-6, "same_top_pct": 100.0},
                "thresholds": {"mean_kld": 1e-5, "p99_kld": 1e-4, "same_top_pct": 98.0},
                "settings": {"ctx": 128, "chunks": 2},
            }
        ],
    }


def test_pipeline_export_writes_an_upstream_ready_result(tree_a, tmp_path: Path) -> None:
    import optuna

    from tuner.cli.export_cmd import export_study
    from tuner.result.upstream_patch import whitespace_only_hunks
    from tuner.result.validate import validate_result

    db = tmp_path / "study.db"
    db.write_bytes(lzma.decompress((REPO / "docs" / "data" / "noise-floors" / "sm90-l1b-v2.db.xz").read_bytes()))
    storage = f"sqlite:///{db}"
    study = optuna.load_study(study_name="sm90-l1b-v2", storage=storage)
    result = {
        "rules": [RULE],
        "dropped": {},
        "tuned": None,
        "rows": _crafted_rows(),
        "upstream_phases": ["pp"],
        "confirm_depths": [32768, 49152, 65536],
    }
    study.set_user_attr("result", result)
    with pytest.raises(UsageError, match="no output-equivalence gate record"):  # confirmed before the gate existed
        export_study("sm90-l1b-v2", storage=storage, out_dir=tmp_path / "out")
    study.set_user_attr("result", {**result, "gate": _crafted_gate(passed=False)})
    with pytest.raises(UsageError, match="failed the output-equivalence gate"):
        export_study("sm90-l1b-v2", storage=storage, out_dir=tmp_path / "out")
    study.set_user_attr("result", {**result, "gate": _crafted_gate(passed=True)})
    out = export_study("sm90-l1b-v2", storage=storage, out_dir=tmp_path / "out")
    files = {p.name for p in out.iterdir()}
    assert {"config.toml", "tuned.patch", "upstream.patch", "PR.md", "report.md", "speedup.png", "run.env"} <= files
    up = (out / "upstream.patch").read_text()
    assert "Q->ne[0] == 64" in up and "gqa_ratio == 4" in up and "K->ne[1] >= 65536" in up
    assert "getenv" not in up and not whitespace_only_hunks(up)
    assert "decode/D64/gqa4/kvf16:65536-=TILE" in (out / "tuned.patch").read_text()  # baked, keyed by shape
    report = (out / "report.md").read_text()
    assert "tg128@d65536" in report and "| Model" in report and "Verdict: **PASS** in mode(s) decode" in report
    assert report.startswith("# tuner result")  # the session-4 screen measured no A/A noise: not "too noisy"
    pr = (out / "PR.md").read_text()
    assert "| tg128@d65536 " in pr and "| tg128@d32768 " in pr and "GGML_TUNER" not in pr and "sqlite:" not in pr
    assert "git apply ../upstream.patch" in pr and "## Models" in pr and str(tmp_path) not in pr
    check = validate_result(out)
    assert check.ok, [f for f in check.findings if not f.ok]


def _threads_one_is_faster(build):
    """llama-bench stand-in for the search's timing (seeded, 0.3% jitter): ``-t 1`` is 10% faster, nothing else
    matters. What this test runs for real is everything after the timing: builds, the output-equivalence gate's
    llama-perplexity runs, the export and validate."""
    import random

    rng = random.Random(7)

    def measure(c, phase: str, depths, label: str):
        args = list(c.args)
        fast = "-t" in args and args[args.index("-t") + 1] == "1"
        return {
            d: {"ts": 100.0 * (1.1 if fast else 1.0) * rng.gauss(1, 0.003), "kernel": None, "why": None, "error": ""}
            for d in depths
        }

    measure.info = {"device": "fake llama-bench"}  # what the live measure reads off llama-bench's gpu_info
    return measure


def test_cpu_search_gates_its_final_config_and_exports_the_numbers(
    cpu_build, tiny_model, tree_a, tmp_path: Path
) -> None:
    from tuner._compat import tomllib
    from tuner.cli.export_cmd import export_study
    from tuner.result.validate import validate_result
    from tuner.search.pipeline import run_pipeline
    from tuner.search.study import SearchConfig
    from tuner.targets.archs import load_arch
    from tuner.targets.target import Target

    cfg = SearchConfig(
        target=Target(arch=load_arch("cpu"), local_archs=()),
        source=tree_a,
        model=tiny_model,
        depths=(0, 256),
        pp=32,
        tg=8,
        trials=3,
        study="gated",
        storage=None,
        run_dir=tmp_path / "run",
        variants=("cpu",),
        fixed={"flash_attn": "on", "ubatch": 512},
        min_rounds=3,
        max_rounds=3,
        refine=0,
        confirm_extra=0,
        seed=0,
        gate=True,
        ci_target=1.0,
        reps_pp=8,
        reps_tg=3,
    )
    result = run_pipeline(cfg, measure_factory=_threads_one_is_faster)
    assert result.tuned is not None and result.tuned.values["threads"] == 1, result  # confirmed by the fake timing
    gate = result.gate
    assert gate["verdict"] == "pass" and [c["name"] for c in gate["checks"]] == ["decode process", "prefill process"]
    # the residency probes ran the real llama-bench -v: one graph split on the CPU backend, everything on the host
    res = result.residency
    assert res["verdict"] == "pass" and "CPU backend" in res["why"]
    assert res["upstream"]["splits_tg"] == res["final"]["splits_tg"] == 1 and not res["final"]["gpu"]
    assert res["final"]["kv_buffers"] and set(res["final"]["kv_buffers"]) == {"CPU"}
    assert (cfg.run_dir / "residency" / "final" / "residency.log").is_file()
    out = export_study("gated", storage=cfg.storage_url, out_dir=tmp_path / "out")
    g = tomllib.loads((out / "config.toml").read_text())["gate"]
    # threads only schedule work: strict, and on the CPU the logits are byte-identical to upstream's
    assert g["verdict"] == "pass" and g["modes"] == ["decode", "prefill"] and g["deterministic"] is True
    assert (
        g["mean_kld"] == 0.0
        and g["p99_kld"] <= 2e-6
        and g["same_top_pct"] == 100.0
        and (g["ctx"], g["chunks"]) == (128, 2)
    )
    assert all(
        c["strict"] and c["identical_to_upstream"] and c["candidate_args"] == ["-fa", "on", "-t", "1"]
        for c in g["checks"]
    )
    assert all((cfg.run_dir / p).is_file() for c in g["checks"] for p in c["logs"].values())  # relative to the run dir
    assert "-b 1 -ub 1" in (cfg.run_dir / g["checks"][0]["logs"]["kld"]).read_text().splitlines()[0]
    assert "Verdict: **PASS** in mode(s) decode, prefill" in (out / "report.md").read_text()
    r = tomllib.loads((out / "config.toml").read_text())["residency"]
    assert r["verdict"] == "pass" and r["final"]["splits_tg"] == 1
    assert "## Graph splits and residency" in (out / "report.md").read_text()
    check = validate_result(out)
    assert check.ok, [f for f in check.findings if not f.ok]
    assert any(f.check == "residency" and f.detail.startswith("pass: decode graph splits 1") for f in check.findings)
    assert any(
        f.check == "output-equivalence gate" and f.detail.startswith("pass in decode, prefill") for f in check.findings
    )
    # the search's cost: every stage it ran timed, each fake llama-bench call and both residency probes counted
    cost = tomllib.loads((out / "config.toml").read_text())["cost"]
    assert cost["screen_s"] > 0 and cost["total_s"] >= cost["screen_s"] + cost["tune_s"] + cost["confirm_s"]
    assert cost["llama_bench_calls"] > 2 and cost["tune_trials"] == len(result.trials) == 3
    assert "gates_s" in cost and "build_s" in cost and "model_s" not in cost  # --model given: nothing synthesized
    assert "**Cost** (resumed runs summed): build_s" in (out / "report.md").read_text()
    # the device the measures reported is the study's (every measure goes through device_guard.device_checked)
    assert tomllib.loads((out / "config.toml").read_text())["target"]["measured_on"] == "fake llama-bench"
    # resumed on the finished study: nothing is measured again, and the times add to the first run's
    again = run_pipeline(cfg, measure_factory=_threads_one_is_faster).cost
    assert again["llama_bench_calls"] == cost["llama_bench_calls"] and again["total_s"] >= cost["total_s"]


def test_a_pinned_study_exports_its_mask_and_derived_knob_values(tree_a, tmp_path: Path) -> None:
    """A study measured under --cpu-mask with tuned threads/-ngl: the export resolves the same derived
    space (from the study's derived_knobs) and its commands carry the pin, so they reproduce the run."""
    import dataclasses

    import optuna

    from tuner.cli.export_cmd import export_study
    from tuner.plan.derive import legal_values
    from tuner.plan.space import load_space
    from tuner.targets.host import Cpus

    db = tmp_path / "study.db"
    db.write_bytes(lzma.decompress((REPO / "docs" / "data" / "noise-floors" / "sm90-l1b-v2.db.xz").read_bytes()))
    storage = f"sqlite:///{db}"
    study = optuna.load_study(study_name="sm90-l1b-v2", storage=storage)
    legal = legal_values(
        load_space("sm_90", "mma"),
        cpus=Cpus(ids=(0, 1), physical=2, masked=True),
        shape={"n_layers": 16, "n_kv_heads": 8, "head_dim": 64},
    )
    study.set_user_attr("derived_knobs", {k: dataclasses.asdict(v) for k, v in legal.items()})
    study.set_user_attr("cpu_mask", [0, 1])
    study.set_user_attr(
        "result",
        {
            "rules": [],
            "dropped": {},
            "tuned": {"trial": 0, "values": {"threads": 1, "ngl": 9}, "params": {"threads": 1, "ngl": 9}},
            "rows": _crafted_rows(),
            "upstream_phases": [],
            "confirm_depths": [32768],
            "gate": _crafted_gate(passed=True),
        },
    )
    out = export_study("sm90-l1b-v2", storage=storage, out_dir=tmp_path / "out")
    run_env = (out / "run.env").read_text()
    assert "# llama-bench: taskset -c 0-1 llama-bench" in run_env and "-t 1 -ngl 9" in run_env
    assert "# llama-server: taskset -c 0-1 llama-server" in run_env
    assert 'cpu_mask = "0-1"' in (out / "config.toml").read_text()
