from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import tuner.targets.archs as archs_mod
from tuner._compat import tomllib
from tuner.cli import cli
from tuner.errors import TunerError, UsageError
from tuner.paths import package_data
from tuner.targets.archs import (
    MATH_KEYS,
    PRODUCT_FIGURES,
    detect_local_archs,
    load_arch,
    load_archs,
    normalize_arch_name,
)

DATA = Path(__file__).resolve().parents[2] / "data" / "models"

REQUIRED = [
    "sm_60",
    "sm_61",
    "sm_70",
    "sm_75",
    "sm_80",
    "sm_86",
    "sm_89",
    "sm_90",
    "gfx906",
    "gfx1030",
    "gfx1100",
    "gfx1150",
    "gfx1151",
    "gfx1200",
    "gfx1201",
    "gfx908",
    "gfx90a",
    "gfx942",
    "cpu",
]


def test_database_covers_required_archs() -> None:
    archs = load_archs()
    assert set(REQUIRED) <= set(archs)


def test_every_figure_has_a_source() -> None:
    for arch in load_archs().values():
        assert arch.source and arch.math["source"]
        for era in arch.kernel_paths.values():
            assert era["source"]
        for p in arch.products:
            for key in PRODUCT_FIGURES:
                if getattr(p, key) is not None:
                    assert p.sources[key].strip(), (arch.name, p.name, key)


@pytest.mark.parametrize(
    ("name", "optin"),
    [("sm_70", 98304), ("sm_75", 65536), ("sm_80", 166912), ("sm_86", 101376), ("sm_89", 101376), ("sm_90", 232448)],
)
def test_nvidia_optin_limits(name: str, optin: int) -> None:
    a = load_arch(name)
    assert a.smem_optin == optin and a.smem_static == 49152 and a.wave_size == 32
    assert a.cc == int(name[3:]) * 10


def test_amd_facts() -> None:
    halo = load_arch("gfx1151")
    assert (halo.smem_static, halo.wave_size, halo.family) == (65536, 32, "RDNA3.5")
    assert halo.products[0].units == 40 and halo.products[0].bandwidth_gbps == 256
    for name in ("gfx906", "gfx908", "gfx90a", "gfx942"):
        assert load_arch(name).wave_size == 64
    assert load_arch("gfx942").math["int8_mfma"] and not load_arch("gfx1100").math["int8_mfma"]


def test_named_products_from_brief() -> None:
    assert load_arch("sm_89").product().name.startswith("GeForce RTX 4060 Ti 16")
    assert load_arch("sm_89").product().bandwidth_gbps == 288
    assert load_arch("sm_90").product("H100").bandwidth_gbps == 3350
    assert load_arch("gfx1100").product().bandwidth_gbps == 960
    assert load_arch("gfx942").product().bandwidth_gbps == 5300
    assert load_arch("cpu").product().bandwidth_gbps is None


def test_kernel_paths_follow_knobs_worked_example() -> None:
    # docs/selector.md worked example: Llama-3.2-1B decodes with VEC on sm_89/90, MMA on sm_80/86, TILE on RDNA3/4.
    assert load_arch("sm_89").kernel_paths["mma"]["fa_decode"] == "VEC"
    assert load_arch("sm_90").kernel_paths["mma"]["fa_prefill"] == "MMA"
    assert load_arch("sm_86").kernel_paths["mma"]["fa_decode"] == "MMA"
    assert load_arch("gfx1151").kernel_paths["mma"]["fa_decode"] == "TILE"
    assert load_arch("gfx1151").kernel_paths["rocwmma"]["fa_decode_rocwmma"] == "WMMA"


@pytest.mark.parametrize(
    ("typed", "canon"),
    [
        ("sm89", "sm_89"),
        ("SM_89", "sm_89"),
        ("8.9", "sm_89"),
        ("89", "sm_89"),
        ("sm_120a", "sm_120"),
        ("GFX1151", "gfx1151"),
        ("strix-halo", "gfx1151"),
        ("Ada", "sm_89"),
        ("hopper", "sm_90"),
    ],
)
def test_aliases(typed: str, canon: str) -> None:
    assert load_arch(typed).name == canon


def test_normalize() -> None:
    assert normalize_arch_name(" compute_90 ") == "sm_90"
    assert normalize_arch_name("gfx90a") == "gfx90a"


def test_unknown_arch_suggests() -> None:
    with pytest.raises(UsageError, match="Did you mean.*sm_89") as exc:
        load_arch("sm88")
    assert exc.value.exit_code == 2
    with pytest.raises(UsageError, match="gfx1151"):
        load_arch("gfx1115")


def test_unknown_product() -> None:
    with pytest.raises(UsageError, match="no product"):
        load_arch("sm_90").product("B200")


def test_missing_key_names_file_arch_key() -> None:
    bad = DATA / "bad_archs.toml"
    with pytest.raises(TunerError, match=r"bad_archs\.toml: arch 'sm_89', key 'smem_optin': missing"):
        load_archs(bad)


def test_unsourced_figure_rejected() -> None:
    with pytest.raises(TunerError, match="sources.bandwidth_gbps"):
        load_archs(DATA / "unsourced_archs.toml")


def test_packaged_file_has_math_keys() -> None:
    raw = tomllib.loads(package_data("archs.toml").read_text())
    for name, tbl in raw["archs"].items():
        assert set(MATH_KEYS) <= set(tbl["math"]), name


def test_cli_archs_table_and_json() -> None:
    runner = CliRunner()
    res = runner.invoke(cli, ["archs"])
    assert res.exit_code == 0, res.output
    assert "| gfx1151 | amd" in res.output and "Strix Halo" in res.output
    res = runner.invoke(cli, ["archs", "--json"])
    names = [a["name"] for a in json.loads(res.output)]
    assert set(REQUIRED) <= set(names)


def test_cli_show_json_done_criterion() -> None:
    res = CliRunner().invoke(cli, ["archs", "show", "gfx1151", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert (d["smem_static"], d["wave_size"], d["family"]) == (65536, 32, "RDNA3.5")
    assert d["products"][0]["sources"]["bandwidth_gbps"]


def test_cli_show_text_and_bad_arch() -> None:
    runner = CliRunner()
    res = runner.invoke(cli, ["archs", "show", "sm_90"])
    assert "smem" in res.output or "opt-in 232448" in res.output
    assert "H100 SXM5 80 GB" in res.output
    res = runner.invoke(cli, ["archs", "show", "sm88"])
    assert isinstance(res.exception, UsageError)


class FakeNVML:
    """pynvml with two devices: an sm_90 each, device i with i+1 GiB free."""

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        return (9, 0)

    def nvmlDeviceGetMemoryInfo(self, h: int):
        import types

        return types.SimpleNamespace(free=(h + 1) << 30)


def test_detect_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML())
    monkeypatch.setattr(archs_mod.shutil, "which", lambda name: None)
    assert detect_local_archs() == ["sm_90"]


def test_detect_rocminfo(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from tuner import _run

    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails -> no NVIDIA
    monkeypatch.setattr(archs_mod.shutil, "which", lambda name: "/opt/rocm/bin/rocminfo")
    out = "Agent 2\n  Name:                    gfx1151\n  ISA 1\n    Name: amdgcn-amd-amdhsa--gfx1151\n"
    monkeypatch.setattr(_run, "run", lambda cmd, **kw: _run.RunResult(returncode=0, output=out, seconds=0.1))
    assert detect_local_archs() == ["gfx1151"]


def test_detect_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(archs_mod.shutil, "which", lambda name: None)
    assert detect_local_archs() == []


def test_detect_nvidia_smi_without_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from tuner import _run

    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(archs_mod.shutil, "which", lambda name: "/usr/bin/nvidia-smi" if name == "nvidia-smi" else None)
    seen = []

    def fake_run(cmd: list[str], **kw: object) -> _run.RunResult:
        seen.append(cmd)
        return _run.RunResult(returncode=0, output="9.0\n8.9\n", seconds=0.1)

    monkeypatch.setattr(_run, "run", fake_run)
    assert detect_local_archs() == ["sm_90", "sm_89"]
    assert seen[0][1:] == ["--query-gpu=compute_cap", "--format=csv,noheader"]


def test_detection_runs_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from tuner import _run
    from tuner.targets.archs import forget_local_archs

    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(archs_mod.shutil, "which", lambda name: "/usr/bin/nvidia-smi" if name == "nvidia-smi" else None)
    calls = []

    def fake_run(cmd: list[str], **kw: object) -> _run.RunResult:
        calls.append(cmd)
        return _run.RunResult(returncode=0, output="9.0\n", seconds=0.1)

    monkeypatch.setattr(_run, "run", fake_run)
    first = detect_local_archs()
    first.append("gfx1151")  # a caller changing its list changes nobody else's
    assert detect_local_archs() == ["sm_90"] and len(calls) == 1
    forget_local_archs()
    assert detect_local_archs() == ["sm_90"] and len(calls) == 2


def test_gpu_free_memory_from_nvml_then_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    """The -ngl knob's fit check: free memory summed over devices; None without an NVIDIA GPU."""
    import sys

    from tuner import _run
    from tuner.targets.archs import gpu_free_bytes

    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML())
    assert gpu_free_bytes() == 3 << 30
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(archs_mod.shutil, "which", lambda name: "/usr/bin/nvidia-smi" if name == "nvidia-smi" else None)
    monkeypatch.setattr(_run, "run", lambda cmd, **kw: _run.RunResult(returncode=0, output="81000\n", seconds=0.1))
    assert gpu_free_bytes() == 81000 << 20
    monkeypatch.setattr(archs_mod.shutil, "which", lambda name: None)
    assert gpu_free_bytes() is None


def test_estimate_uses_the_local_gpus_product_or_says_which_it_assumed(monkeypatch: pytest.MonkeyPatch) -> None:
    # sm_90 lists the H100 first; on an H200 the estimate used the H100's bandwidth without a word.
    from tuner.targets import archs
    from tuner.targets.defaults import DEFAULT_QUANT
    from tuner.targets.models import load_model_shape
    from tuner.targets.roofline import estimate

    h200 = next(p.name for p in archs.load_arch("sm_90").products if "H200" in p.name)
    args = ["estimate", "--arch", "sm_90", "--like", "llama-3.2-1b", "--depths", "0", "--json"]
    monkeypatch.setattr(archs, "local_gpu_names", lambda: ["NVIDIA H200"])
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    want = estimate("sm_90", load_model_shape("llama-3.2-1b"), [0], product=h200, weight_type=DEFAULT_QUANT.lower())
    assert {r["product"] for r in rows} == {h200} and rows == want
    assert f"product {h200} (this machine's GPU, NVIDIA H200)" in res.stderr

    monkeypatch.setattr(archs, "local_gpu_names", lambda: [])
    res = CliRunner().invoke(cli, args)
    first = archs.load_arch("sm_90").products[0].name
    assert {r["product"] for r in json.loads(res.stdout)} == {first}
    assert f"product {first} assumed" in res.stderr and len(res.stderr.strip().splitlines()) == 1

    res = CliRunner().invoke(cli, [*args, "--product", "H200"])
    assert {r["product"] for r in json.loads(res.stdout)} == {h200}
