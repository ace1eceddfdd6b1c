"""tuner.measure.exe.backend_device: the device a build's backend measures on, from ``llama-bench --list-devices``."""

from __future__ import annotations

import os
from pathlib import Path

from tuner.measure.exe import backend_device, parse_list_devices

# common/arg.cpp: "  %s: %s (%zu MiB, %zu MiB free)" per device, "  (none)" without one
H100 = "Available devices:\n  CUDA0: NVIDIA H100 80GB HBM3 (81559 MiB, 80991 MiB free)\n"
TWO = "Available devices:\n  CUDA0: NVIDIA H200 (143771 MiB, 143000 MiB free)\n  Vulkan0: NVIDIA H200 (143771 MiB, 1 MiB free)\n"


def test_list_devices_is_read_without_the_memory_figures() -> None:
    assert parse_list_devices(H100) == {"CUDA0": "NVIDIA H100 80GB HBM3"}
    assert parse_list_devices(TWO) == {"CUDA0": "NVIDIA H200", "Vulkan0": "NVIDIA H200"}
    assert parse_list_devices("Available devices:\n  (none)\n") == {}


def test_backend_device_asks_the_builds_llama_bench(tmp_path: Path) -> None:
    exe = tmp_path / "llama-bench"
    (tmp_path / "devices.txt").write_text(H100)
    exe.write_text(f'#!/bin/sh\n[ "$1" = --list-devices ] && cat {tmp_path / "devices.txt"}\n')
    exe.chmod(0o755)
    assert backend_device(tmp_path, "CUDA0") == "NVIDIA H100 80GB HBM3"
    assert backend_device(tmp_path, "CUDA1") is None  # not listed: nothing to record
    assert backend_device(tmp_path / "none", "CUDA0") is None  # no llama-bench in the build
    assert backend_device(tmp_path / "none", "CPU").startswith("CPU ")
    assert os.access(exe, os.X_OK)
