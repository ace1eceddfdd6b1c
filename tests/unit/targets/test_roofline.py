from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tuner.cli import cli
from tuner.errors import UsageError
from tuner.targets.models import load_model_shape, load_models, synth_model
from tuner.targets.roofline import ESTIMATE_LABEL, bytes_per_token, estimate, flops_per_token

DATA = Path(__file__).resolve().parents[2] / "data" / "models"


def test_bytes_from_shape_f16() -> None:
    s = load_model_shape("llama-3.2-1b")
    b = bytes_per_token(s, 0)
    embd = 2048 * 128256 * 2
    # every weight once (the tied token_embd is the LM head) + one embedding row for the lookup
    assert (
        b["weights_bytes"]
        == (1_235_814_432 - 2048 * 16 * 2 - 2048 - 32) * 2 + (2048 * 16 * 2 + 2048 + 32) * 4 + embd // 128256
    )
    assert b["kv_bytes"] == 0 and not b["quantized"]


def test_kv_bytes_formula() -> None:
    s = load_model_shape("llama-3.1-8b")
    b = bytes_per_token(s, 4096, "f16")
    assert b["kv_bytes"] == 2 * 32 * 8 * 128 * 4096 * 2
    assert bytes_per_token(s, 4096, "q8_0")["kv_bytes"] == int(2 * 32 * 8 * 128 * 4096 * 34 / 32)
    with pytest.raises(UsageError, match="KV type"):
        bytes_per_token(s, 0, "q3")
    with pytest.raises(UsageError, match="Depth"):
        bytes_per_token(s, -1)


def test_untied_head_reads_output_and_one_row() -> None:
    s = load_model_shape("llama-3.1-8b")
    w = bytes_per_token(s, 0)["weights_bytes"]
    embd_row = 4096 * 2
    output = 4096 * 128256 * 2
    body = sum(
        t.n_bytes
        for t in __import__("tuner.targets.models", fromlist=["x"]).plan_tensors(s)
        if t.kind not in ("embd", "output")
    )
    assert w == body + output + embd_row


def test_flops() -> None:
    s = load_model_shape("llama-3.2-1b")
    f = flops_per_token(s, 1000)
    matmul_params = 16 * (2048 * 2048 * 2 + 2048 * 512 * 2 + 3 * 2048 * 8192) + 2048 * 128256
    assert f["matmul_flops"] == 2 * matmul_params
    assert f["attention_flops"] == 4 * 16 * 32 * 64 * 1000


def test_gguf_uses_real_sizes(tmp_path: Path) -> None:
    shape = load_models(DATA / "micro_models.toml")["micro-qwen"]
    res = synth_model(shape, tmp_path / "q.gguf", vocab_path=DATA / "vocab-micro.gguf", weight_type="q8_0")
    from_file = bytes_per_token(res.path, 64)
    from_shape = bytes_per_token(shape, 64, weight_type="q8_0")
    assert from_file["weights_bytes"] == from_shape["weights_bytes"] and from_file["quantized"]
    assert "GGUF" in from_file["weights_source"]
    assert flops_per_token(res.path, 64)["total_flops"] == flops_per_token(shape, 64)["total_flops"]


def test_estimate_h100_matches_device_note() -> None:
    # research/device.md: 3.35 TB/s over 0.80 GB of weights bounds tg d0 at ~4190 t/s (1B Q4_K_M).
    rows = estimate("sm_90", load_model_shape("llama-3.2-1b"), [0], weight_type="q4_k_m")
    tg = next(r for r in rows if r["test"] == "tg128")
    assert 4100 < tg["bound_tps"] < 4200 and "3350" in tg["limit"]
    pp = next(r for r in rows if r["test"] == "pp512")
    assert "INT8" in pp["limit"] and pp["bound_tps"] > tg["bound_tps"]
    assert all(r["label"] == ESTIMATE_LABEL for r in rows)


def test_estimate_depth_lowers_tg_and_pp() -> None:
    rows = estimate("gfx1151", load_model_shape("llama-3.2-1b"), [0, 16384])
    tg = [r["bound_tps"] for r in rows if r["test"] == "tg128"]
    pp = [r["bound_tps"] for r in rows if r["test"] == "pp512"]
    assert tg[0] > tg[1] and pp[0] > pp[1]
    assert "FP16" in rows[0]["limit"]  # f16 weights -> FP16 peak


def test_estimate_fp32_on_p40_and_cpu_bandwidth() -> None:
    rows = estimate("sm_61", load_model_shape("tiny"), [0])
    assert "FP32" in rows[0]["limit"]
    with pytest.raises(UsageError, match="--bandwidth"):
        estimate("cpu", load_model_shape("tiny"), [0])
    rows = estimate("cpu", load_model_shape("tiny"), [0], bandwidth=50)
    assert rows[0]["bound_tps"] is None and rows[1]["bound_tps"] == pytest.approx(50e9 / rows[1]["bytes_per_token"])
    with pytest.raises(UsageError, match="bandwidth"):
        estimate("cpu", load_model_shape("tiny"), [0], bandwidth=-1)


def test_tg_roofline_tps(tmp_path: Path) -> None:
    # the decode bound of a GGUF at depth d: tg=1 puts the run's mean depth at d itself
    shape = load_models(DATA / "micro_models.toml")["micro"]
    res = synth_model(shape, tmp_path / "m.gguf", vocab_path=DATA / "vocab-micro.gguf")
    tps = estimate("sm_89", res.path, [0], pp=0, tg=1)[0]["bound_tps"]
    assert tps == pytest.approx(288e9 / bytes_per_token(res.path, 0)["total_bytes"])
    assert estimate("cpu", res.path, [0], pp=0, tg=1, bandwidth=10)[0]["bound_tps"] < tps
    with pytest.raises(UsageError, match="does not exist"):
        estimate("sm_89", tmp_path / "nope.gguf", [0], pp=0, tg=1)


def test_cli_estimate() -> None:
    runner = CliRunner()
    res = runner.invoke(
        cli, ["estimate", "--arch", "sm89", "--like", "llama-3.2-1b", "--quant", "q4_k_m", "--depths", "0", "--json"]
    )
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert {r["test"] for r in rows} == {"pp512", "tg128"} and rows[0]["product"].startswith("GeForce RTX 4060 Ti")
    res = runner.invoke(cli, ["estimate", "--arch", "gfx1151", "--like", "tiny", "--depths", "0"])
    assert "not a measurement" in res.output and "| tg128" in res.output
    res = runner.invoke(cli, ["estimate", "--arch", "sm_89"])
    assert isinstance(res.exception, UsageError) and "--like" in str(res.exception)
    res = runner.invoke(
        cli, ["estimate", "--arch", "sm_89", "--like", "tiny", "--product", "4090", "--json", "--depths", "0"]
    )
    assert json.loads(res.output)[1]["limit"].startswith("memory: 1008")
