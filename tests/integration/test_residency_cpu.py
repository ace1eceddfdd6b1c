"""The residency check on the real CPU build with the `tiny` model (one llama-bench -v call, ~1 s)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tuner.measure.residency import input_layer_mib, is_host_buffer, judge, run_residency
from tuner.targets.models import load_gguf_shape

pytestmark = pytest.mark.integration


def test_cpu_build_reports_one_split_and_host_buffers(cpu_build, tiny_model: Path, tmp_path: Path) -> None:
    r = run_residency(cpu_build.bin_dir, tiny_model, args=["-t", "2"], log_dir=tmp_path)
    assert r.error == "" and r.log_file.is_file()
    assert not r.gpu and r.splits_tg == r.splits_pp == 1
    # the KV buffer is what the model's shape says for the context llama.cpp chose (f16 K and V)
    shape = load_gguf_shape(tiny_model)
    n_ctx = int(re.search(r"llama_context: n_ctx\s+=\s+(\d+)", r.log_file.read_text()).group(1))
    kv = shape.n_layers * n_ctx * shape.n_kv_heads * shape.head_dim * 2 * 2 / 2**20
    assert r.kv_buffers == {"CPU": round(kv, 2)}
    # everything is on the host; the mapped weights hold at least the input layer (a native build on an
    # AMX host also repacks the weights into ggml-cpu's AMX buffer, in host memory too)
    assert "CPU_Mapped" in r.model_buffers and set(r.model_buffers) <= {"CPU_Mapped", "AMX"}
    assert all(map(is_host_buffer, r.model_buffers)) and not r.gpu
    assert r.host_weights_mib >= input_layer_mib(tiny_model)
    assert judge(r, host_weights_mib=input_layer_mib(tiny_model)) == (True, ())


def test_a_failed_run_is_data(cpu_build, tiny_model: Path, tmp_path: Path) -> None:
    r = run_residency(cpu_build.bin_dir, tiny_model, args=["--no-such-flag"], log_dir=tmp_path)
    assert "exited with code" in r.error and "--no-such-flag" in r.error
    assert judge(r)[0] is False
