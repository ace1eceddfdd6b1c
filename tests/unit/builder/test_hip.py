"""Unit tests for tuner.builder.hip (no apt-get, no clang: tuner._run.run is faked or forbidden)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from packaging.version import Version
from scikit_build_core.cmake import CMake

from tuner import _run
from tuner.builder import cmake as B
from tuner.builder import hip
from tuner.cli import cli
from tuner.errors import TunerError, UsageError
from tuner.plan.variant import RenderedVariant

TOY = Path(__file__).resolve().parents[2] / "data" / "build" / "toy"


def fail_on_call(*args, **kwargs):
    raise AssertionError(f"unexpected process start: {args}")


def fake_prefix(tmp_path: Path, archs=("1151", "1100", "942")) -> Path:
    """A prefix laid out like a finished setup (files empty; nothing here can compile)."""
    prefix = tmp_path / "hip"
    usr = prefix / "root" / "usr"
    (usr / "include" / "hip").mkdir(parents=True)
    (usr / "include" / "hip" / "hip_runtime.h").write_text("")
    (usr / "include" / "hip" / "hip_version.h").write_text(
        "#define HIP_VERSION_MAJOR 6\n#define HIP_VERSION_MINOR 4\n#define HIP_VERSION_PATCH 43484\n"
    )
    (usr / "bin").mkdir()
    lib = usr / "lib" / "x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / "librocblas.so.4.4").write_text("")
    bc = usr / "lib" / "llvm-17" / "lib" / "clang" / "17" / "amdgcn" / "bitcode"
    bc.mkdir(parents=True)
    for a in archs:
        (bc / f"oclc_isa_version_{a}.bc").write_text("")
    (prefix / "venv" / "bin").mkdir(parents=True)
    (prefix / "venv" / "bin" / "cmake").write_text("")
    (prefix / "toolchain.json").write_text(json.dumps({"recipe": hip._RECIPE}))
    return prefix


def test_parse_offload_targets() -> None:
    data = (
        b"\x00__CLANG_OFFLOAD_BUNDLE__hipv4-amdgcn-amd-amdhsa--gfx1151\x00"
        b"hipv4-amdgcn-amd-amdhsa--gfx1100\x00host-x86_64-unknown-linux-gnu-\x00gfx1151"
    )
    assert hip.parse_offload_targets(data) == ["gfx1100", "gfx1151"]
    assert hip.parse_offload_targets(b"\x7fELF no bundle here gfx1151") == []


def test_find_returns_none_for_empty_prefix(tmp_path: Path) -> None:
    assert hip.find_hip_toolchain(tmp_path / "nothing") is None


def test_require_says_how_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(TunerError, match="tuner toolchain hip --prefix"):
        hip.require_hip_toolchain(tmp_path / "nothing")


def test_found_toolchain_defines_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hip, "_clang_ok", lambda: True)
    tc = hip.find_hip_toolchain(fake_prefix(tmp_path))
    assert tc is not None and tc.hip_version == "6.4.43484"
    assert tc.device_archs == ("gfx1151", "gfx1100", "gfx942")
    d = tc.defines()
    assert d["CMAKE_HIP_COMPILER"].endswith("llvm-19/bin/clang++")
    assert f"--rocm-path={tc.rocm_path}" in d["CMAKE_HIP_FLAGS"]
    assert "amdgcn/bitcode" in d["CMAKE_HIP_FLAGS"] and "--allow-shlib-undefined" in d["CMAKE_HIP_FLAGS"]
    assert d["CMAKE_PREFIX_PATH"] == str(tc.rocm_path)
    env = tc.env({"PATH": "/usr/bin"})
    assert env["ROCM_PATH"] == str(tc.rocm_path) and env["HIP_PLATFORM"] == "amd"
    assert env["PATH"].startswith("/usr/lib/llvm-19/bin")
    with pytest.raises(UsageError, match="gfx1201"):
        tc.require_arch("gfx1201")


def test_setup_is_idempotent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hip, "_clang_ok", lambda: True)
    monkeypatch.setattr(_run, "run", fail_on_call)
    tc, did_work = hip.run_hip_setup(fake_prefix(tmp_path))
    assert not did_work and tc.prefix == tmp_path / "hip"


def test_not_root_says_what_to_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hip, "_clang_ok", lambda: False)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(_run, "run", fail_on_call)
    with pytest.raises(TunerError) as info:
        hip.run_hip_setup(tmp_path / "p")
    msg = str(info.value)
    assert "sudo apt-get install -y --no-install-recommends clang-19 lld-19 clang-tools-19 libclang-rt-19-dev" in msg
    assert "\n" not in msg


def test_private_apt_config_leaves_system_alone(tmp_path: Path) -> None:
    conf = hip._write_apt_config(tmp_path / "apt")
    text = conf.read_text()
    assert f'Dir::Etc::SourceList "{tmp_path / "apt" / "sources.list"}";' in text
    assert 'Acquire::Check-Valid-Until "false";' in text
    sources = (tmp_path / "apt" / "sources.list").read_text()
    assert " trixie main" in sources and " sid main" in sources and "/etc/apt" not in text


def test_hip_variant_builds_with_toolchain_cmake(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated_home: Path
) -> None:
    """A GGML_HIP=ON variant must use the toolchain's cmake<4 and its compiler defines."""
    monkeypatch.setattr(hip, "_clang_ok", lambda: True)
    tc = hip.find_hip_toolchain(fake_prefix(tmp_path))
    monkeypatch.setattr(hip, "require_hip_toolchain", lambda *a, **k: tc)
    asked = {}

    def tools(cmake_executable=None, cmake_spec=">=3.28"):
        asked.update(exe=cmake_executable, spec=cmake_spec)
        return B.BuildTools(
            cmake=CMake(version=Version("3.31.10"), cmake_path=Path(cmake_executable)), ninja=Path("/usr/bin/true")
        )

    monkeypatch.setattr(B, "find_build_tools", tools)
    calls = []

    def fake_run(cmd, *, env=None, log_file=None, **kw):
        args = [os.fspath(c) for c in cmd]
        calls.append((args, env))
        if args[-1] == "--version":
            return _run.RunResult(returncode=0, output="v\n", seconds=0)
        raise TunerError("configure failed (fake)")

    monkeypatch.setattr(_run, "run", fake_run)
    B._version_line.cache_clear()
    rv = RenderedVariant(
        arch="gfx1151",
        variant="hip",
        era="mma",
        source_id="toy",
        source_root=TOY,
        defines={"GGML_HIP": "ON", "GPU_TARGETS": "gfx1151"},
        patch="",
        files={},
    )
    with pytest.raises(TunerError, match="configure failed"):
        B.build_variant(rv, compile_only=True, objects=["ggml/src/ggml-cuda/fattn.cu"])
    assert asked == {"exe": str(tc.cmake), "spec": ">=3.28,<4"}
    args, env = next((a, e) for a, e in calls if a[-1] != "--version")
    assert args[0] == str(tc.cmake)
    assert f"-DCMAKE_HIP_COMPILER={tc.clangxx}" in args and "-DGPU_TARGETS=gfx1151" in args
    assert env["ROCM_PATH"] == str(tc.rocm_path)
    rv1201 = RenderedVariant(
        arch="gfx1201",
        variant="hip",
        era="mma",
        source_id="toy",
        source_root=TOY,
        defines={"GGML_HIP": "ON", "GPU_TARGETS": "gfx1201"},
        patch="",
        files={},
    )
    with pytest.raises(UsageError, match="no device library for gfx1201"):
        B.build_variant(rv1201, compile_only=True)
    B._version_line.cache_clear()


def test_cli_toolchain_hip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hip, "_clang_ok", lambda: True)
    monkeypatch.setattr(_run, "run", fail_on_call)
    prefix = fake_prefix(tmp_path)
    res = CliRunner().invoke(cli, ["toolchain", "hip", "--prefix", str(prefix)])
    assert res.exit_code == 0, res.output
    assert "already set up (no work)" in res.output and "gfx1151, gfx1100, gfx942" in res.output
