"""The output-equivalence gate's parsing and decision rule, on real llama-perplexity output.

Fixtures in tests/data/equivalence/ are real logs captured on the CPU backend with the `tiny` model
(paths shortened): upstream vs itself (pass), a q4_0 KV cache candidate (fail), a KLD run against a
file that is not a log-prob file (exit 0, no statistics), and base runs: ok, too little text, no model.
"""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

import tuner._run
from tuner._run import RunResult
from tuner.errors import UsageError
from tuner.measure.equivalence import (
    DEFAULT_THRESHOLDS,
    KldStats,
    Thresholds,
    _tool_error,
    judge,
    parse_base_output,
    parse_kld_output,
    run_equivalence,
    widened_rules,
    write_gate_text,
)
from tuner.plan.fa_rules import parse_fa_rules, rules_texts

DATA = Path(__file__).resolve().parents[2] / "data" / "equivalence"


def _stats(mean: float = 0.0, p99: float = 1e-6, top: float = 100.0) -> KldStats:
    return KldStats(
        mean_kld=mean,
        mean_kld_unc=0.0,
        p99_kld=p99,
        max_kld=p99,
        median_kld=0.0,
        same_top_pct=top,
        same_top_unc=0.0,
        ppl_q=1.0,
        ppl_base=1.0,
    )


def test_parse_real_pass() -> None:
    s = parse_kld_output((DATA / "kld-cpu-self-pass.log").read_text())
    assert s.complete
    assert (s.mean_kld, s.p99_kld, s.max_kld, s.same_top_pct) == (0.0, 0.000001, 0.000001, 100.0)
    assert s.ppl_q == pytest.approx(123164.626812) and s.ppl_base == pytest.approx(123164.460878)


def test_parse_real_fail_and_nan_chunk_lines() -> None:
    text = (DATA / "kld-cpu-q4kv-fail.log").read_text()
    s = parse_kld_output(text)
    assert (s.mean_kld, s.mean_kld_unc, s.p99_kld, s.max_kld) == (0.000584, 0.000013, 0.000873, 0.000907)
    assert (s.same_top_pct, s.same_top_unc) == (83.333, 3.333) and s.median_kld == 0.000574
    assert judge(stats=s, deterministic=True)[0] is False


def test_bad_base_file_exits_0_without_statistics() -> None:
    text = (DATA / "kld-cpu-bad-base.log").read_text()
    s = parse_kld_output(text)
    assert not s.complete and math.isnan(s.mean_kld)
    assert "does not look like a file containing log-probabilities" in _tool_error(text)
    ok, why = judge(stats=s, deterministic=True)
    assert not ok and "No KL divergence statistics" in why[0]


def test_parse_base_runs() -> None:
    assert parse_base_output((DATA / "base-cpu-ok.log").read_text()) == pytest.approx(123164.6268)
    short = (DATA / "base-cpu-short-text.log").read_text()
    assert parse_base_output(short) is None and "need at least 256 tokens" in _tool_error(short)
    nomodel = (DATA / "base-cpu-no-model.log").read_text()
    assert parse_base_output(nomodel) is None and "failed to open GGUF file" in _tool_error(nomodel)


@pytest.mark.parametrize(
    ("stats", "det", "ident", "strict", "ok", "words"),
    [
        (_stats(), True, False, False, True, []),
        (_stats(), False, False, False, False, ["Not deterministic"]),
        (_stats(), True, False, True, False, ["Strict"]),
        (_stats(), True, True, True, True, []),
        (_stats(mean=1.1e-5), True, False, False, False, ["Mean KLD"]),
        (_stats(mean=1e-5, p99=1e-4, top=98.0), True, False, False, True, []),  # limits are inclusive
        (_stats(p99=1.5e-4), True, False, False, False, ["99% KLD"]),
        (_stats(top=97.9), True, False, False, False, ["Same top p"]),
        (_stats(mean=float("nan")), True, False, False, False, ["No KL divergence"]),
        (None, None, None, False, False, ["No KL divergence"]),
    ],
)
def test_decision_rule(stats, det, ident, strict, ok, words) -> None:
    passed, why = judge(stats=stats, deterministic=det, identical_to_upstream=ident, strict=strict)
    assert passed is ok
    assert len(why) == len(words) and all(w in r for w, r in zip(words, why))


def test_thresholds_sit_between_the_measured_floor_and_the_measured_changes() -> None:
    from tuner.measure.equivalence import CALIBRATION

    t = DEFAULT_THRESHOLDS
    for name, (mean, p99, _mx, top) in CALIBRATION["floor"].items():
        assert judge(stats=_stats(mean, p99, top), deterministic=True)[0], name
    for name, (mean, p99, _mx, top) in CALIBRATION["deliberate changes"].items():
        assert judge(stats=_stats(mean, p99, top), deterministic=True)[0] is ("q8_0" in name), name
    assert judge(stats=_stats(2e-5), deterministic=True, thresholds=Thresholds(mean_kld=1e-4))[0] and t.mean_kld == 1e-5


def test_gate_text_is_fixed(tmp_path: Path) -> None:
    a = write_gate_text(tmp_path / "a.txt").read_text()
    assert a == write_gate_text(tmp_path / "b.txt").read_text()
    # Pinned: a changed text changes every upstream base file and every stored gate number.
    import hashlib

    assert hashlib.sha256(a.encode()).hexdigest()[:16] == "a44b9d563b8c1364" and len(a.split()) == 3000


def test_widened_rules() -> None:
    got = widened_rules(
        parse_fa_rules("decode/D64/gqa4/kvf16:32768-=MMA,decode:0-4096=VEC,prefill:0-=TILE,decode:8192-16384=MMA")
    )
    assert {p.value: rules_texts(rs) for p, rs in got.items()} == {
        "decode": ["decode/D64/gqa4/kvf16:0-=MMA", "decode:0-=VEC", "decode:0-=MMA"],
        "prefill": ["prefill:0-=TILE"],
    }


# --------------------------------------------------------------------------- run_equivalence with a fake tool


def _fake_bin(tmp_path: Path, name: str = "bin") -> Path:
    d = tmp_path / name
    d.mkdir()
    exe = d / "llama-perplexity"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return d


def _fake_run(kld_text: str, *, digests: dict[str, bytes], rc: int = 0):
    """Stand-in for tuner._run.run: base runs write ``digests[tag]`` bytes; KLD runs print ``kld_text``."""
    calls: list[list[str]] = []

    def run(cmd, *, env=None, log_file=None, timeout=None, check=True, on_line=None, what=None, cwd=None):
        args = [os.fspath(c) for c in cmd]
        calls.append(args)
        if "--kl-divergence" in args:
            text = kld_text
        else:
            out = Path(args[args.index("--kl-divergence-base") + 1])
            tag = "upstream" if out.name.startswith("upstream") else out.stem
            out.write_bytes(digests[tag])
            text = "Final estimate: PPL = 123164.6268 +/- 3985.92013\n"
        log_file.write_text(text)
        for line in text.splitlines():
            on_line(line)
        return RunResult(returncode=rc, output="", seconds=0.1, log_file=log_file)

    return run, calls


def test_run_equivalence_pass_and_upstream_reuse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    b = _fake_bin(tmp_path)
    run, calls = _fake_run(
        (DATA / "kld-cpu-self-pass.log").read_text(),
        digests={"upstream": b"u", "candidate-a": b"u", "candidate-b": b"u"},
    )
    monkeypatch.setattr(tuner._run, "run", run)
    res = run_equivalence(b, b, model, mode="decode", candidate_args=["-t", "1"], work_dir=tmp_path / "w", strict=True)
    assert res.passed and res.deterministic and res.identical_to_upstream and res.verdict == "pass"
    assert len(calls) == 4 and all(c[c.index("-b") + 1] == "1" and c[c.index("-ub") + 1] == "1" for c in calls)
    assert calls[1][-2:] == ["-t", "1"] and "--kl-divergence" in calls[3]
    assert not (tmp_path / "w" / "candidate-a.kld").exists()  # large files go unless keep_files
    assert set(res.as_dict()["logs"]) == {"upstream", "candidate-a", "candidate-b", "kld"}
    run_equivalence(b, b, model, mode="decode", work_dir=tmp_path / "w")
    assert len(calls) == 7  # upstream's file was reused


def test_run_equivalence_nondeterministic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    b = _fake_bin(tmp_path)
    run, _ = _fake_run(
        (DATA / "kld-cpu-self-pass.log").read_text(),
        digests={"upstream": b"u", "candidate-a": b"a", "candidate-b": b"b"},
    )
    monkeypatch.setattr(tuner._run, "run", run)
    res = run_equivalence(b, b, model, work_dir=tmp_path / "w")
    assert not res.passed and res.deterministic is False and "Not deterministic" in res.reasons[0]
    assert "NOT deterministic" in res.summary


def test_failed_tool_is_a_failed_gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    b = _fake_bin(tmp_path)
    nomodel = (DATA / "base-cpu-no-model.log").read_text()

    def run(cmd, *, env=None, log_file=None, timeout=None, check=True, on_line=None, what=None, cwd=None):
        log_file.write_text(nomodel)
        for line in nomodel.splitlines():
            on_line(line)
        return RunResult(returncode=1, output="", seconds=0.1, log_file=log_file)

    monkeypatch.setattr(tuner._run, "run", run)
    res = run_equivalence(b, b, model, work_dir=tmp_path / "w")
    assert not res.passed and res.deterministic is None and len(res.reasons) == 1
    assert (
        "Upstream's run failed" in res.reasons[0]
        and "exit 1" in res.reasons[0]
        and "upstream-prefill" in res.reasons[0]
    )


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"mode": "both"}, "mode must be one of"),
        ({"ctx": 8}, "ctx must be"),
        ({"chunks": 0}, "chunks must be"),
        ({"chunks": 1}, "no KL divergence statistics under 100"),
        ({"candidate_args": ["-c", "64"]}, "set by the equivalence gate"),
        ({"candidate_args": ["--kl-divergence"]}, "set by the equivalence gate"),
        ({"candidate_env": {"BAD NAME": "1"}}, "invalid"),
    ],
)
def test_bad_input_is_a_usage_error(tmp_path: Path, kw, words) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    b = _fake_bin(tmp_path)
    with pytest.raises(UsageError, match=words):
        run_equivalence(b, b, model, work_dir=tmp_path / "w", **kw)


def test_missing_tool_and_model(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    with pytest.raises(UsageError, match="llama-perplexity not found"):
        run_equivalence(empty, empty, model, work_dir=tmp_path / "w")
    with pytest.raises(UsageError, match="does not exist"):
        run_equivalence(_fake_bin(tmp_path), empty, tmp_path / "nope.gguf", work_dir=tmp_path / "w")


def test_cli_bad_input_exit_2_and_fail_exit_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    import sys

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    b = _fake_bin(tmp_path)
    env = {**os.environ, "TUNER_HOME": str(tmp_path / "home")}
    bad = subprocess.run(
        [sys.executable, "-m", "tuner", "equivalence", "--build", str(b), "--model", str(model), "--args", "-b 4"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "set by the equivalence gate" in bad.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "tuner", "equivalence", "--build", str(b), "--model", str(model), "--args", "'unclosed"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert bad.returncode == 2 and "cannot be split" in bad.stderr

    from tuner.cli import cli

    run, _ = _fake_run(
        (DATA / "kld-cpu-q4kv-fail.log").read_text(),
        digests={"upstream": b"u", "candidate-a": b"a", "candidate-b": b"a"},
    )
    monkeypatch.setattr(tuner._run, "run", run)
    res = CliRunner().invoke(
        cli, ["equivalence", "--build", str(b), "--model", str(model), "-o", str(tmp_path / "o"), "--json"]
    )
    assert res.exit_code == 1 and '"verdict": "fail"' in res.output
    assert "Same top p 83.333% < threshold 98%" in str(res.exception)
