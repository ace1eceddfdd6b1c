"""An export's files in a real llama.cpp tree: the pinned tree A with CMakeUserPresets.json copied in lists
its presets with cmake, and `tuner export -o <that tree>` refuses to write into it."""

from __future__ import annotations

import lzma
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
STUDIES = {  # name -> stored database: one GPU result with a rule, the CPU default (nothing to patch)
    "sm90-l1b-v3": REPO / "results" / "sm_90" / "llama-3.2-1b-q4_k_m" / "evidence" / "study.db.xz",
    "cpu-tiny-f16-s0-832db069-mma": REPO / "results" / "cpu" / "tiny-f16" / "evidence" / "study.db.xz",
}


def _pristine_copy(tree_a, dest: Path) -> Path:
    """Tree A's top-level files copied (the preset files live there), its folders linked: pristine to cmake."""
    dest.mkdir()
    for p in Path(tree_a.root).iterdir():
        if p.is_dir():
            (dest / p.name).symlink_to(p, target_is_directory=True)
        else:
            shutil.copy2(p, dest / p.name)
    return dest


@pytest.mark.parametrize("study", sorted(STUDIES))
def test_presets_list_in_a_pristine_tree(tree_a, tmp_path: Path, study: str) -> None:
    from tuner.cli.export_cmd import export_study

    db = tmp_path / "study.db"
    db.write_bytes(lzma.decompress(STUDIES[study].read_bytes()))
    out = export_study(study, storage=f"sqlite:///{db}", out_dir=tmp_path / "out")
    assert not (out / "CMakePresets.json").exists()
    tree = _pristine_copy(tree_a, tmp_path / "llama.cpp")
    tree_presets = (tree / "CMakePresets.json").read_bytes()
    shutil.copy(out / "CMakeUserPresets.json", tree / "CMakeUserPresets.json")
    res = subprocess.run(["cmake", "--list-presets"], cwd=tree, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    name = "tuned-sm90" if study.startswith("sm90") else "tuned-cpu"
    assert f'"{name}"' in res.stdout and '"x64-linux-gcc-release"' in res.stdout  # ours beside the tree's own
    assert (tree / "CMakePresets.json").read_bytes() == tree_presets
    if study.startswith("cpu"):
        assert not (out / "tuned.patch").exists()  # nothing to patch: `git apply` of an empty file exits 128


def test_export_into_a_llama_cpp_tree_is_refused(tree_a, tmp_path: Path) -> None:
    tree = _pristine_copy(tree_a, tmp_path / "llama.cpp")
    before = sorted(p.name for p in tree.iterdir())
    db = tmp_path / "study.db"
    db.write_bytes(lzma.decompress(STUDIES["sm90-l1b-v3"].read_bytes()))
    env = {k: v for k, v in os.environ.items() if k != "TUNER_DEBUG"}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "tuner",
            "export",
            "--study",
            "sm90-l1b-v3",
            "--storage",
            f"sqlite:///{db}",
            "-o",
            str(tree),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert res.returncode == 2, res.stderr
    assert "is a llama.cpp source tree" in res.stderr and "copy CMakeUserPresets.json into the tree" in res.stderr
    assert sorted(p.name for p in tree.iterdir()) == before


@pytest.mark.parametrize(
    ("tree", "arch", "variant", "values", "baked", "empty"),
    [
        ("a", "sm_90", "cuda", {}, {}, True),
        ("a", "sm_90", "cuda", {}, {"GGML_TUNER_FA_T3": "8192"}, True),  # upstream's own T3: still nothing to patch
        ("a", "sm_90", "cuda", {}, {"GGML_TUNER_FA_T3": "4096"}, False),
        ("a", "sm_90", "cuda", {"mma.ampere.d64.c64.nthreads": 256}, {}, False),
        ("a", "gfx1151", "hip", {"tile.amd_rdna.d64.c4.occupancy": 4}, {}, False),
        ("b", "gfx1151", "hip-rocwmma", {}, {}, True),
        ("b", "gfx1151", "hip-rocwmma", {"wmma.nwarps": 8}, {"GGML_TUNER_WMMA_DECODE": "1"}, False),
    ],
)
def test_export_patch_is_empty_or_clean(
    request, tmp_path: Path, tree: str, arch: str, variant: str, values: dict, baked: dict, empty: bool
) -> None:
    """The exported patch: none where it would select upstream's kernels, else one that applies to the pristine
    tree with no whitespace-only hunk and no comment citing tuner's own files."""
    import re

    from tuner.result.export import export_render
    from tuner.result.upstream_patch import whitespace_only_hunks
    from tuner.result.validate import git_apply_to_copy

    src = request.getfixturevalue(f"tree_{tree}")
    rv = export_render(src, arch, variant, compile_values=values, baked=baked)
    assert (rv.patch == "") is empty
    if not empty:
        assert whitespace_only_hunks(rv.patch) == []
        assert not re.search(r"knobs\.md|docs/|templates/|\.j2\b|design\.md", rv.patch)
        (tmp_path / "tuned.patch").write_text(rv.patch)
        res, _ = git_apply_to_copy(tmp_path / "tuned.patch", src.root)
        assert res.returncode == 0, res.output
