"""Graph-split and residency parsing and its rule (docs/soak.md).

tests/data/residency/: ``cpu-*.log`` are real llama-bench -v logs of the cached CPU build with the
`tiny` model (paths shortened); ``cuda-*.log`` are written from the pinned tree's CUDA format strings
(each file's header names the source lines), because no GPU was available to capture them.
Expected numbers come from the model file or from the log lines themselves, not typed in.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tuner.errors import UsageError
from tuner.measure.residency import (
    DEFAULT_MAX_SPLITS,
    Residency,
    input_layer_mib,
    is_host_buffer,
    judge,
    parse_residency,
    run_residency,
)

DATA = Path(__file__).resolve().parents[2] / "data" / "residency"


def _log(name: str) -> str:
    return (DATA / name).read_text()


def _line_mib(text: str, pattern: str) -> float:
    return float(re.search(pattern + r"\s*=\s*([\d.]+) MiB", text).group(1))


def test_cpu_log_is_parsed() -> None:
    text = _log("cpu-tiny-pg512-16.log")
    r = parse_residency(text)
    assert not r.gpu and r.devices == () and r.layers_offloaded is None
    assert r.model_buffers == {"CPU_Mapped": _line_mib(text, "CPU_Mapped model buffer size")}
    assert r.kv_buffers == {"CPU": _line_mib(text, "CPU KV buffer size")}
    assert r.compute_buffers == {"CPU": _line_mib(text, r"sched_reserve:\s+CPU compute buffer size")}
    assert r.output_buffers == {"CPU": _line_mib(text, "CPU  output buffer size")}
    n_layers = int(re.search(r"block_count u32\s+=\s+(\d+)", text).group(1))
    assert sorted(r.kv_devices) == list(range(n_layers)) and set(r.kv_devices.values()) == {"CPU"}
    assert sorted(r.layer_devices) == list(range(n_layers + 1))  # + the output layer
    assert r.splits_pp == r.splits_tg == 1  # one backend: one split
    assert r.fallbacks == ()


def test_cpu_backend_reports_and_passes() -> None:
    r = parse_residency(_log("cpu-tiny-pg512-16.log"))
    assert judge(r) == (True, ())
    assert "graph splits 1" in r.summary and "CPU_Mapped" in r.summary


def test_cuda_full_offload_passes() -> None:
    text = _log("cuda-full-offload.log")
    r = parse_residency(text)
    assert r.gpu and r.devices == ("CUDA0 (NVIDIA H100 80GB HBM3)",)
    assert r.layers_offloaded == r.layers_total == len(r.layer_devices)
    assert set(r.layer_devices.values()) == {"CUDA0"} and set(r.kv_devices.values()) == {"CUDA0"}
    assert r.host_weights_mib == _line_mib(text, "CPU_Mapped model buffer size")
    assert r.device_weights_mib == _line_mib(text, "CUDA0 model buffer size")
    assert r.host_kv_mib == 0 and r.splits_tg == DEFAULT_MAX_SPLITS
    assert r.output_buffers == {"CUDA_Host": _line_mib(text, "CUDA_Host  output buffer size")}
    assert judge(r, host_weights_mib=r.host_weights_mib) == (True, ())


def test_cuda_kv_on_host_fails_with_reasons() -> None:
    r = parse_residency(_log("cuda-nkvo.log"))
    ok, why = judge(r)
    assert not ok
    assert any("KV cache is (partly) in host memory" in w for w in why)
    assert any(f"{r.splits_tg} splits" in w for w in why)
    assert r.splits_pp == r.splits_tg and r.nodes_pp == r.nodes_tg  # the "A / B" form
    assert judge(r, full_offload=False) == (True, ())  # partial offload: reported, not judged


def test_weights_beyond_the_input_layer_fail() -> None:
    r = parse_residency(_log("cuda-full-offload.log"))
    ok, why = judge(r, host_weights_mib=r.host_weights_mib / 2)
    assert not ok and "input layer" in why[0]


def test_partial_offload_and_fallback_fail() -> None:
    text = _log("cuda-full-offload.log")
    n = re.search(r"offloaded (\d+)/(\d+)", text)
    short = int(n.group(2)) - 1
    partial = text.replace(n.group(0), f"offloaded {short}/{n.group(2)}").replace(
        "layer   0 assigned to device CUDA0", "layer   0 assigned to device CPU"
    )
    # the wording of llama-context.cpp:537 with a probe name the pinned tree uses
    partial += (
        "sched_reserve: layer 3 is assigned to device CUDA0 but fused Gated Delta Net (chunked) "
        "is assigned to device CPU (usually due to missing support)\n"
    )
    ok, why = judge(parse_residency(partial))
    assert not ok
    assert any(f"Only {short}/" in w for w in why) and any("Layers [0]" in w for w in why)
    assert any("fell back off the GPU" in w for w in why)


def test_older_wording_is_read() -> None:
    # 2024 trees: "llm_load_tensors: CPU buffer size", "graph nodes  = N" and "graph splits = N" lines
    # (e.g. sched_reserve output quoted in ggml-org/llama.cpp#21730); the parser must not miss them.
    old = (
        _log("cuda-full-offload.log")
        .replace("model buffer size", "buffer size")
        .replace(
            "sched_reserve: graph: nodes = 566, splits = 2,",
            "sched_reserve: graph nodes  = 566\nsched_reserve: graph splits = 2\n#",
        )
    )
    r = parse_residency(old.replace("load_tensors:", "llm_load_tensors:"))
    assert r.splits_tg == DEFAULT_MAX_SPLITS and r.nodes_tg is not None
    assert r.device_weights_mib > 0 and r.host_weights_mib > 0


def test_failed_run_is_a_failed_check() -> None:
    r = parse_residency(_log("cpu-bad-flag.log"))
    assert r.splits_tg is None and not r.model_buffers
    failed = Residency(**{**r.__dict__, "error": "llama-bench exited with code 1"})
    ok, why = judge(failed)
    assert not ok and "failed" in why[0]


def test_host_buffer_names() -> None:
    assert all(map(is_host_buffer, ("CPU", "CPU_Mapped", "CPU_REPACK", "CUDA_Host", "ROCm_Host")))
    assert not any(map(is_host_buffer, ("CUDA0", "ROCm0", "Vulkan0", "CUDA_Split")))


def test_bad_input(tmp_path: Path) -> None:
    (tmp_path / "llama-bench").write_text("#!/bin/sh\n")
    (tmp_path / "llama-bench").chmod(0o755)
    with pytest.raises(UsageError, match="does not exist"):
        run_residency(tmp_path, tmp_path / "none.gguf", log_dir=tmp_path)
    (tmp_path / "m.gguf").write_bytes(b"")
    with pytest.raises(UsageError, match="set by the residency check"):
        run_residency(tmp_path, tmp_path / "m.gguf", args=["-r", "3"], log_dir=tmp_path)
    with pytest.raises(UsageError, match="not found"):
        run_residency(tmp_path / "nowhere", tmp_path / "m.gguf", log_dir=tmp_path)


def test_input_layer_size_of_a_missing_model(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        input_layer_mib(tmp_path / "none.gguf")


def test_amx_buffer_is_host_memory() -> None:
    # A real probe of the tiny f16 model on a native CPU build on an AMX host (Xeon, Sapphire Rapids
    # class): ggml-cpu repacks the weights into its "AMX" buffer. That is host memory, not a GPU.
    assert is_host_buffer("AMX")
    r = parse_residency(_log("cpu-tiny-amx.log"))
    assert set(r.model_buffers) == {"AMX", "CPU_Mapped"} and not r.gpu
    assert judge(r) == (True, ())
