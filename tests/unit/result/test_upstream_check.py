"""``tuner validate --gpu`` logic: which depths decide a rule, reading ncu's report, the decode tail,
and the findings when the GPU parts are replaced by fakes (the real run is recorded in tests/data/ncu and results/sm_90/llama-3.2-1b-q4_k_m/evidence)."""

from __future__ import annotations

import lzma
from pathlib import Path

import pytest
from click.testing import CliRunner

from tuner.cli import cli
from tuner.plan.fa_rules import parse_fa_rules
from tuner.result import upstream_check as uc
from tuner.result.checks import load_toml_in

SM90 = Path(__file__).resolve().parents[3] / "results" / "sm_90" / "llama-3.2-1b-q4_k_m"


def _points(kernels: dict[int, str]) -> list[dict[str, object]]:
    return [{"phase": "tg", "depth": d, "kernel": k} for d, k in kernels.items()] + [
        {"phase": "pp", "depth": 0, "kernel": "MMA"}
    ]


def test_decision_depths_bracket_each_decode_rule() -> None:
    pts = _points({0: "VEC", 16384: "VEC", 32768: "MMA", 49152: "MMA", 65536: "MMA"})
    assert uc.decision_depths(parse_fa_rules("decode/D128/gqa4/kvf16:32768-=MMA"), pts) == [16384, 32768]
    # a bounded rule: the lowest depth inside it and the highest below it, nothing above it
    assert uc.decision_depths(parse_fa_rules("decode:16384-49152=TILE"), pts) == [0, 16384]
    assert uc.decision_depths(parse_fa_rules("prefill:0-=MMA"), pts) == []


def _csv(names: list[str]) -> str:
    # ncu --csv --page raw: a header, a units row, one quoted row per profiled launch; program output before it
    head = '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Device","CC","gpu__time_duration.sum"'
    rows = [f'"{i}","77","llama-bench","127.0.0.1","{n}","1","13","0","9.0","{1000 + i}"' for i, n in enumerate(names)]
    return "\n".join(
        [
            "build_commit,model_filename",
            "==PROF== Disconnected from process 77",
            head,
            '"","","","","","","","","","nsecond"',
            *rows,
        ]
    )


def test_parse_ncu_csv_keeps_launch_order_and_function_names() -> None:
    names = ["flash_attn_ext_f16", "flash_attn_ext_f16<128, 128, 1, 4, false>", "flash_attn_tile(float const*)"]
    assert uc.parse_ncu_csv(_csv(names)) == ["flash_attn_ext_f16", "flash_attn_ext_f16", "flash_attn_tile"]
    assert uc.parse_ncu_csv("no report here\n") == []


def test_decode_family_is_the_tail_after_the_depth_fill() -> None:
    fill = ["flash_attn_ext_f16"] * 40
    assert uc.decode_family(fill + ["flash_attn_tile"] * 8, n_layers=2, n_gen=4) == ("TILE", "")
    assert uc.decode_family(fill + ["flash_attn_ext_f16"] * 8, n_layers=2, n_gen=4) == ("MMA", "")
    fam, why = uc.decode_family(fill[:-1] + ["flash_attn_ext_vec"] * 8 + ["flash_attn_ext_f16"], n_layers=2, n_gen=4)
    assert fam is None and "mix" in why
    fam, why = uc.decode_family(["flash_attn_ext_vec"] * 3, n_layers=2, n_gen=4)
    assert fam is None and "fewer than the 8" in why


def test_no_gpu_of_the_arch_skips_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tuner.targets.archs.detect_local_archs", lambda: ["sm_89"])
    [f] = uc.upstream_gpu_findings(SM90, load_toml_in(SM90, "config.toml"), source=None)
    assert f.ok and "needs a sm_90 GPU, this machine has sm_89" in f.detail


@pytest.fixture()
def gpu_fakes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, object]:
    """An sm_90 machine whose tools are fakes: test-backend-ops passes, ncu and the tuned log report `seen`."""
    from tuner.measure.gate import CheckResult

    seen: dict[str, object] = {"upstream": {}, "tuned": {}, "check": []}
    monkeypatch.setattr("tuner.targets.archs.detect_local_archs", lambda: ["sm_90"])
    monkeypatch.setattr(uc, "find_ncu", lambda: tmp_path / "ncu")

    def check(bin_dir, **kw):
        seen["check"].append(kw)  # type: ignore[union-attr]
        return CheckResult(
            passed=True,
            n_ok=12,
            n_fail=0,
            n_not_supported=0,
            failing=(),
            log_file=tmp_path / "c.log",
            summary="12/12 cases passed",
        )

    monkeypatch.setattr("tuner.measure.gate.run_check", check)
    monkeypatch.setattr(uc, "_ncu_decode_kernel", lambda ncu, b, m, d, n, log: (seen["upstream"].get(d), ""))  # type: ignore[union-attr]
    monkeypatch.setattr(uc, "_tuned_decode_kernel", lambda b, m, d, r, e, log: (seen["tuned"].get(d), ""))  # type: ignore[union-attr]
    return seen


def _run(tmp_path: Path, **kw: object) -> dict[str, tuple[bool, str]]:
    model = tmp_path / "l1b-q4km.gguf"
    model.write_bytes(b"GGUF")
    (tmp_path / "bin").mkdir(exist_ok=True)
    fs = uc.upstream_gpu_findings(
        SM90,
        load_toml_in(SM90, "config.toml"),
        source=None,
        models=[model],
        upstream_bin=tmp_path / "bin",
        log_dir=tmp_path / "logs",
        **kw,
    )
    return {f.check: (f.ok, f.detail) for f in fs}


def test_selection_matches_the_recorded_tuned_kernels(gpu_fakes: dict, tmp_path: Path) -> None:
    # the 1B's rule decode/D64/gqa4/kvf16:32768-=TILE: decided at d16384 (upstream VEC) and d32768 (TILE)
    gpu_fakes["upstream"].update({16384: "VEC", 32768: "TILE", 49152: "TILE", 65536: "TILE"})
    res = _run(tmp_path)
    ok, detail = res["upstream.patch selects the tuned kernels"]
    assert ok, detail
    assert "d16384: tuned VEC, upstream.patch VEC" in detail and "d32768: tuned TILE, upstream.patch TILE" in detail
    assert res["upstream.patch test-backend-ops FLASH_ATTN_EXT"][0]
    # the FA cases of the result's head size, as the search's gate
    assert gpu_fakes["check"][0]["params"].startswith("hsk=64,hsv=64,")


def test_a_patch_that_misses_a_depth_fails_and_says_where(gpu_fakes: dict, tmp_path: Path) -> None:
    gpu_fakes["upstream"].update({16384: "VEC", 32768: "VEC"})
    gpu_fakes["tuned"].update({16384: "VEC", 32768: "TILE"})
    ok, detail = _run(tmp_path, tuned_bin=tmp_path / "bin")["upstream.patch selects the tuned kernels"]
    assert not ok and "d32768: tuned TILE, upstream.patch VEC" in detail


def test_without_ncu_the_selection_is_not_claimed(
    gpu_fakes: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(uc, "find_ncu", lambda: None)
    ok, detail = _run(tmp_path)["upstream.patch selects the tuned kernels"]
    assert not ok and "ncu" in detail


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--model", "m.gguf"], "belongs to --gpu, --bench or --soak"),
        (["--tuned-bin", "."], "belong to --gpu"),
        (["--bench", "--model", "absent.gguf"], "is not a file"),
        (["--gpu", "--model", "absent.gguf"], "is not a file"),
        (["--gpu", "--upstream-bin", "."], "has no llama-bench"),
    ],
)
def test_cli_bad_gpu_input_is_one_paragraph_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], says: str
) -> None:
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli, ["validate", str(SM90), *args], standalone_mode=False)
    assert getattr(r.exception, "exit_code", None) == 2 and says in str(r.exception)


def test_a_real_ncu_report_from_the_h100() -> None:
    """A smoke run on the H100 (tests/data/ncu): the 1B at d65536 under ncu, rules off, so the decode
    steps are upstream's VEC after a fill that ran MMA; 16 layers x 4 generated tokens."""
    log = Path(__file__).resolve().parents[3] / "tests/data/ncu/h100-l1b-d65536.log.xz"
    names = uc.parse_ncu_csv(lzma.decompress(log.read_bytes()).decode())
    assert set(names[:-64]) == {"flash_attn_ext_f16"}
    assert uc.decode_family(names, n_layers=16) == ("VEC", "")
