"""`tuner ab` refuses what it cannot measure, before measuring anything."""

from __future__ import annotations

import os
from pathlib import Path

from click.testing import CliRunner

from tuner.cli import cli


def _fake_build(tmp_path: Path, lib: bytes | None) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "llama-bench"
    exe.write_text("#!/bin/sh\nexit 99\n")  # would fail loudly if it were ever run
    os.chmod(exe, 0o755)
    if lib is not None:
        (bin_dir / "libggml-cuda.so").write_bytes(lib)
    return bin_dir


def test_a_bad_kernel_or_rule_is_refused(tmp_path: Path) -> None:
    b, m = _fake_build(tmp_path, b"...GGML_TUNER_FA_RULES..."), tmp_path / "m.gguf"
    m.write_bytes(b"GGUF")
    for bad in ("decode:0-=WMMA", "decode:x-=MMA", "decode/D0:0-=MMA"):
        res = CliRunner().invoke(
            cli, ["ab", "--build", str(b), "--model", str(m), "--rules", bad], standalone_mode=False
        )
        assert res.exception is not None and getattr(res.exception, "exit_code", None) == 2, (bad, res.output)


def test_a_build_without_the_hook_is_refused(tmp_path: Path) -> None:
    b, m = _fake_build(tmp_path, None), tmp_path / "m.gguf"
    m.write_bytes(b"GGUF")
    res = CliRunner().invoke(
        cli, ["ab", "--build", str(b), "--model", str(m), "--rules", "decode:0-=TILE"], standalone_mode=False
    )
    assert getattr(res.exception, "exit_code", None) == 2 and "no tuner FA rules hook" in str(res.exception)


def test_depths_must_be_integers(tmp_path: Path) -> None:
    b, m = _fake_build(tmp_path, b"GGML_TUNER_FA_RULES"), tmp_path / "m.gguf"
    m.write_bytes(b"GGUF")
    res = CliRunner().invoke(
        cli, ["ab", "--build", str(b), "--model", str(m), "--rules", "decode:0-=TILE", "--depths", "0,4k"]
    )
    assert res.exit_code == 2 and "not a comma-separated list of integers" in res.output


def test_ab_prints_the_compare_table_judged_like_the_search(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # A stand-in measure: upstream runs VEC; the forced rule runs TILE, 10% faster at d32768 and equal at d0.
    import tuner.rounds.live as live

    calls = {"n": 0}

    def measure(cand, phase, depths, label):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        wobble = 1 + 0.002 * (calls["n"] % 3)
        forced = "GGML_TUNER_FA_RULES" in cand.env
        return {
            d: {
                "ts": 100.0 * wobble * (1.10 if forced and d == 32768 else 1.0),
                "error": "",
                "kernel": "TILE" if forced else "VEC",
                "why": "rule" if forced else "default",
            }
            for d in depths
        }

    monkeypatch.setattr(live, "make_live_measure", lambda *a, **k: measure)
    b = _fake_build(tmp_path, b"...GGML_TUNER_FA_RULES...")
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    res = CliRunner().invoke(
        cli,
        [
            "ab",
            "--build",
            str(b),
            "--model",
            str(tmp_path / "m.gguf"),
            "--rules",
            "decode:0-=TILE",
            "--rounds",
            "4",
            "-o",
            str(tmp_path / "run"),
        ],
    )
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("|")]
    assert [c.strip() for c in lines[0].strip("|").split("|")][:8] == [
        "Model",
        "Test",
        "t/s upstream",
        "t/s B1",
        "Speedup",
        "95% CI",
        "Noise",
        "Verdict",
    ]
    d0 = next(ln for ln in lines if "| tg128 " in ln)
    d32k = next(ln for ln in lines if "tg128@d32768" in ln)
    assert "faster" not in d0 and "✓ faster" in d32k and "VEC → TILE" in d32k and "A/A" in d32k
    assert "geometric mean of the per-round ratios" in res.stderr


def test_rules_reach_the_hook_in_canonical_form(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # The parser tolerates spaces after commas; the C++ hook does not (it would abort on " prefill"), so
    # the env value is the parsed rules written back.
    import tuner.rounds.live as live

    seen: list[str] = []

    def measure(cand, phase, depths, label):  # type: ignore[no-untyped-def]
        if "GGML_TUNER_FA_RULES" in cand.env:
            seen.append(cand.env["GGML_TUNER_FA_RULES"])
        return {d: {"ts": 100.0, "error": "", "kernel": "VEC", "why": "default"} for d in depths}

    monkeypatch.setattr(live, "make_live_measure", lambda *a, **k: measure)
    b = _fake_build(tmp_path, b"...GGML_TUNER_FA_RULES...")
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    res = CliRunner().invoke(
        cli,
        [
            "ab",
            "--build",
            str(b),
            "--model",
            str(tmp_path / "m.gguf"),
            "--rules",
            "decode:0-4096=VEC, prefill:0-=MMA",
            "--rounds",
            "2",
            "-o",
            str(tmp_path / "run"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert seen and set(seen) == {"decode:0-4096=VEC,prefill:0-=MMA"}


def test_ab_names_the_model_in_its_table(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # The Model column was empty: the points carried no model.
    import tuner.rounds.live as live

    def measure(cand, phase, depths, label):  # type: ignore[no-untyped-def]
        return {d: {"ts": 100.0, "error": "", "kernel": "VEC", "why": "default"} for d in depths}

    monkeypatch.setattr(live, "make_live_measure", lambda *a, **k: measure)
    b = _fake_build(tmp_path, b"...GGML_TUNER_FA_RULES...")
    model = tmp_path / "llama-1b-q4.gguf"
    model.write_bytes(b"GGUF")
    res = CliRunner().invoke(
        cli,
        ["ab", "--build", str(b), "--model", str(model), "--rules", "decode:0-=TILE", "--rounds", "2"]
        + ["-o", str(tmp_path / "run")],
    )
    assert res.exit_code == 0, res.output
    rows = [ln for ln in res.stdout.splitlines() if ln.startswith("|") and "tg128" in ln]
    assert rows and {ln.strip("|").split("|")[0].strip() for ln in rows} == {model.name}
