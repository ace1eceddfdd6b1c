"""tuner.plan.seed_builds: the six reference builds (docs/seed004-builds.md) mapped onto variants, defines and bench args."""

from __future__ import annotations

import json
import os
import re
import sys
import types
from pathlib import Path

import pytest

import tuner._run
from tuner.errors import TunerError, UsageError
from tuner.measure import bench
from tuner.measure.exe import check_env
from tuner.plan import render, seed_builds, space
from tuner.plan.variant import VARIANTS

TREE_A = Path(__file__).resolve().parents[2] / "data" / "render" / "treeA"
SEED = Path("/work/shared/seeds/004_367c5d5a5ecbbaf7.txt")  # the project's seed; absent outside this workplace
SHAPE = {"n_layers": 16, "n_kv_heads": 8, "head_dim": 64, "gqa": 4}  # Llama-3.2-1B's header values
PINNED = "0c1e57098"


@pytest.fixture(autouse=True)
def _no_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*a: object, **k: object) -> None:
        raise AssertionError("unit tests must not start processes")

    monkeypatch.setattr(tuner._run, "run", fail)


def _src(root: Path) -> types.SimpleNamespace:
    return types.SimpleNamespace(root=root, era="mma", source_id="0" * 16, commit=None, spec="test")


def _pinned_tree() -> Path | None:
    home = Path(os.environ.get("TUNER_HOME", Path.home() / ".cache" / "tuner-test"))
    for meta in sorted((home / "sources").glob("*/source.json")):
        if json.loads(meta.read_text()).get("commit") == PINNED and (meta.parent / "llama.cpp").is_dir():
            return meta.parent / "llama.cpp"
    return None


def _option_defaults(root: Path) -> dict[str, str]:
    """option(NAME "help" DEFAULT) of the tree, ${VAR} defaults resolved from the first set(VAR ON|OFF)."""
    text = "\n".join((root / p).read_text() for p in ("CMakeLists.txt", "ggml/CMakeLists.txt"))
    sets: dict[str, str] = {}
    for var, val in re.findall(r"\bset\s*\(\s*(\w+)\s+(ON|OFF)\s*\)", text):
        sets.setdefault(var, val)
    out = {}
    for name, default in re.findall(r'\boption\s*\(\s*(\w+)\s+"[^"]*"\s+([^)\s]+)\s*\)', text):
        m = re.fullmatch(r"\$\{(\w+)\}", default)
        out[name] = sets.get(m.group(1), default) if m else default
    return out


def test_six_builds_map_to_existing_variants_in_the_seeds_order() -> None:
    builds = seed_builds.load_seed_builds()
    assert [b.seed_rank for b in builds] == [1, 2, 3, 4, 5, 6]
    for b in builds:
        assert b.variant in VARIANTS and b.offload in seed_builds.OFFLOADS and b.note
    if not SEED.is_file():
        pytest.skip(f"{SEED} is not here: the ranking is checked against the seed's own §3.9.8 text only where it is")
    text = SEED.read_text()
    ranking = re.search(r"### 3\.9\.8.*?\n((?:\d+\. `build_\w+`\n)+)", text, re.S)
    assert ranking is not None
    assert [f"build_{b.name}" for b in builds] == re.findall(r"`(build_\w+)`", ranking.group(1))
    section_names = re.findall(r"#### (3\.3\.\d) `build_(\w+)`", text)
    assert sorted((b.section, b.name) for b in builds) == sorted(section_names)


def test_seed_defines_exist_in_the_pinned_tree_and_need_nothing_the_variant_lacks() -> None:
    root = _pinned_tree()
    if root is None:
        pytest.skip(f"no cached llama.cpp {PINNED} tree under $TUNER_HOME/sources (`tuner source fetch` makes one)")
    declared = render._declared_options(root)
    defaults = _option_defaults(root)
    # Options older llama.cpp had for these builds, which the seed's words might suggest; none is in this tree
    # (docs/seed004-builds.md says so).
    assert (
        not {"GGML_CUBLAS", "GGML_CUDA_F16", "GGML_CUDA_DMMV_X", "GGML_CUDA_MMV_Y", "GGML_CUDA_FORCE_DMMV"} & declared
    )
    for b in seed_builds.load_seed_builds():
        rv = render.render_variant(_src(root), "sm_90", b.variant)
        for name, value in b.seed_defines.items():
            assert name in declared, (b.name, name)
            # what the variant renders, or else the tree's default: no build needs a define its variant lacks
            assert rv.defines.get(name, defaults.get(name)) == value, (
                b.name,
                name,
                rv.defines.get(name),
                defaults.get(name),
            )


def test_runtime_flags_pass_the_bench_checks_and_follow_the_model() -> None:
    sp = space.load_space("sm_90", "mma")
    runs = {b.name: seed_builds.seed_run(b, sp, shape=SHAPE) for b in seed_builds.load_seed_builds()}
    for r in runs.values():
        assert bench.check_passthrough_args(r.bench_args, bench._OWN_FLAGS, sets="tuner bench") == r.bench_args
        assert check_env(r.env) == r.env
    half = str(SHAPE["n_layers"] // 2)
    assert runs["cuda_hybrid"].bench_args == ("-ngl", half)
    assert runs["cpu_cuda_hybrid"].bench_args == ("-ngl", half, "-nkvo", "1")
    assert runs["cpu_hybrid"].bench_args == ("-ngl", "0")
    for name in ("cuda_mmq_moe", "cuda_dense", "cuda_cublas_dense"):
        assert runs[name].bench_args == () and runs[name].env == {}  # full offload: llama-bench's default


def test_each_mapped_variant_renders_for_sm_90() -> None:
    for b in seed_builds.load_seed_builds():
        rv = render.render_variant(_src(TREE_A), "sm_90", b.variant)
        assert rv.variant == b.variant and rv.defines["CMAKE_CUDA_ARCHITECTURES"] == "90-real"
        assert rv.defines["GGML_CUDA"] == "ON"
        for name in ("GGML_CUDA_FORCE_MMQ", "GGML_CUDA_FORCE_CUBLAS"):
            if name in b.seed_defines:
                assert rv.defines[name] == b.seed_defines[name]
    # through 89-virtual on an H100, as the measurement plan runs the sm_89 builds
    rv = render.render_variant(_src(TREE_A), "sm_89", "cuda-force-mmq", local_archs=["sm_90"])
    assert rv.defines["CMAKE_CUDA_ARCHITECTURES"] == "89-virtual"


def test_bad_names_and_missing_shapes_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="cuda_hybrid"):
        seed_builds.seed_build("cuda_hybird")
    assert seed_builds.seed_build("build_cpu_hybrid").name == "cpu_hybrid"
    sp = space.load_space("sm_90", "mma")
    with pytest.raises(UsageError, match="layer count"):
        seed_builds.seed_run(seed_builds.seed_build("cuda_hybrid"), sp, shape=None)


def test_malformed_mapping_file_is_refused(tmp_path: Path) -> None:
    text = seed_builds.package_data("seed004_builds.toml").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace('variant = "cuda-force-cublas"', 'variant = "cuda-cublas"'))
    with pytest.raises(TunerError, match="cuda-force-cublas"):
        seed_builds.load_seed_builds(bad)
    bad.write_text(text.replace("seed_rank = 6", "seed_rank = 5"))
    with pytest.raises(TunerError, match="ranks"):
        seed_builds.load_seed_builds(bad)


def test_bench_cli_refuses_bad_seed_build_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tuner.cli import main

    b = tmp_path / "b"
    b.mkdir()
    (b / "llama-bench").write_text("")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    base = ["tuner", "bench", "--build", str(b), "--model", str(model)]
    cases = {
        ("--seed-build", "cpu_hybrid"): "needs --arch",
        ("--seed-build", "cpu_hybrid", "--seed-build", "cuda_dense", "--arch", "sm_90"): "one per build",
    }
    for args, msg in cases.items():
        monkeypatch.setattr(sys, "argv", base + list(args))
        with pytest.raises(SystemExit) as exc:
            main()
        err = capsys.readouterr().err
        assert exc.value.code == 2 and msg in err and "Traceback" not in err, err
