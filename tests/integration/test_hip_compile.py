"""Real HIP compile-checks for gfx1151 with the clang-19 + Debian ROCm toolchain (`tuner toolchain hip`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tuner.builder.cmake import build_variant, default_check_objects
from tuner.builder.hip import find_hip_toolchain, parse_offload_targets
from tuner.plan.variant import RenderedVariant

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COMMON = {
    "GGML_HIP": "ON",
    "GGML_NATIVE": "OFF",
    "LLAMA_CURL": "OFF",
    "LLAMA_BUILD_TESTS": "OFF",
    "LLAMA_BUILD_TOOLS": "OFF",
    "LLAMA_BUILD_EXAMPLES": "OFF",
    "LLAMA_BUILD_SERVER": "OFF",
}


@pytest.fixture()
def hip_ready(hip_toolchain) -> None:
    assert find_hip_toolchain() is not None


def test_tree_a_fa_tus_compile_for_gfx1151(hip_ready: None, tree_a) -> None:
    TREE_A = tree_a.root
    rv = RenderedVariant(
        arch="gfx1151",
        variant="hip",
        era="mma",
        source_id="treeA-0c1e570",
        source_root=TREE_A,
        defines={**COMMON, "GPU_TARGETS": "gfx1151", "LLAMA_OPENSSL": "OFF"},
        patch="",
        files={},
    )
    assert len(default_check_objects(rv)) == 3  # fattn.cu, tile dkq64, mma ncols1_16-ncols2_4 (CLI default)
    b = build_variant(rv, compile_only=True, objects=["ggml/src/ggml-cuda/fattn.cu"], jobs=os.cpu_count())
    assert b.compile_only and b.meta["status"] == "ok"
    objs = b.meta["offload_targets"]
    assert [Path(o).name for o in objs] == ["fattn.cu.o"]
    for obj in objs:
        assert parse_offload_targets((b.build_dir / obj).read_bytes()) == ["gfx1151"]  # real gfx1151 code objects
    print(f"compile-check seconds: {b.seconds:.1f} (rebuilt {b.meta['rebuilt_count']} TUs)")


def test_tree_b_rocwmma_variant_checks_what_it_can(hip_ready: None, tree_b, capfd: pytest.CaptureFixture[str]) -> None:
    TREE_B = tree_b.root
    rv = RenderedVariant(
        arch="gfx1151",
        variant="hip-rocwmma",
        era="rocwmma",
        source_id="treeB-b6129",
        source_root=TREE_B,
        defines={**COMMON, "AMDGPU_TARGETS": "gfx1151", "GGML_HIP_ROCWMMA_FATTN": "ON"},
        patch="",
        files={},
    )
    b = build_variant(rv, compile_only=True, jobs=os.cpu_count())  # fattn.cu, fattn-tile-f16.cu, vec hs64
    assert "rocWMMA headers are not available" in b.meta["notes"]["rocwmma"]
    got = {Path(o).name: archs for o, archs in b.meta["offload_targets"].items()}
    assert got == {
        "fattn.cu.o": [],  # host dispatch only in tree B: no device code, no bundle
        "fattn-tile-f16.cu.o": ["gfx1151"],
        "fattn-vec-f16-instance-hs64-f16-f16.cu.o": ["gfx1151"],
    }


def test_patched_tree_a_compiles_for_gfx1151_through_the_cli(hip_ready: None, tree_a) -> None:
    """`tuner build --arch gfx1151 --compile-only`: the era-mma hook, with a non-default tile row."""
    from click.testing import CliRunner

    from tuner.cli import cli

    res = CliRunner().invoke(
        cli, ["build", "--arch", "gfx1151", "--compile-only", "--object", "ggml/src/ggml-cuda/fattn.cu"]
    )
    assert res.exit_code == 0, res.output
