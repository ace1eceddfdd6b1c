from __future__ import annotations

import json
import math
import os
import stat
import sys
import types
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import tuner._run
from tuner._run import RunResult
from tuner.errors import TunerError, UsageError
from tuner.measure.bench import COLUMNS, parse_bench_jsonl, run_bench
from tuner.measure.frames import load_results, render_table, save_results
from tuner.measure.interleave import BenchTarget, run_interleaved
from tuner.measure.observe import Observer, find_gpu_probe

DATA = Path(__file__).resolve().parents[2] / "data" / "bench"

# file -> [(test, depth, n_samples, flash_attn)]; add real GPU captures here.
REAL_BENCH = {
    "llama-bench-mma-cpu.jsonl": [("pp64", 0, 3, 1), ("pp64", 256, 3, 1)],
    "llama-bench-rocwmma-crafted.jsonl": [("pp512", 0, 4, 1), ("tg128", 4096, 4, 1)],
}

MMA_HELP = "  -fa, --flash-attn <on|off|auto>                   (default: auto)\n"
ROCWMMA_HELP = "  -fa, --flash-attn <0|1>                   (default: 0)\n"


@pytest.mark.parametrize("name", sorted(REAL_BENCH))
def test_parse_fixtures(name: str) -> None:
    recs = parse_bench_jsonl((DATA / name).read_text())
    got = [(r["test"], r["n_depth"], len(r["samples_ts"]), r["flash_attn"]) for r in recs]
    assert got == REAL_BENCH[name]
    for r in recs:
        assert r["build_commit"] and r["model_size"] > 0 and all(s > 0 for s in r["samples_ts"])


def test_parse_derives_ts_from_ns_and_skips_noise() -> None:
    line = json.dumps({"n_prompt": 0, "n_gen": 100, "n_depth": 8, "flash_attn": False, "samples_ns": [1e9, 2e9]})
    recs = parse_bench_jsonl("log line\n{not json\n" + line + "\n")
    assert len(recs) == 1
    assert recs[0]["samples_ts"] == [100.0, 50.0] and recs[0]["phase"] == "tg" and recs[0]["flash_attn"] == 0


# --------------------------------------------------------------------------- fake llama-bench


def _fake_bin(tmp_path: Path) -> Path:
    exe = tmp_path / "bin" / "llama-bench"
    exe.parent.mkdir(exist_ok=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe.parent


def _arg(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


class FakeBench:
    """Stands in for tuner._run.run: answers --help and prints JSONL like llama-bench."""

    def __init__(
        self,
        sampler: Callable[[dict, int], float],
        *,
        help_text: str = MMA_HELP,
        fail_depths: tuple[int, ...] = (),
        timeout_on: int | None = None,
    ) -> None:
        self.sampler, self.help_text = sampler, help_text
        self.fail_depths, self.timeout_on = fail_depths, timeout_on
        self.calls: list[tuple[list[str], dict]] = []

    def __call__(self, cmd, *, env=None, log_file=None, on_line=None, timeout=None, check=True, **kw):  # type: ignore[no-untyped-def]
        cmd = [os.fspath(c) for c in cmd]
        self.calls.append((cmd, dict(env or {})))
        if "--help" in cmd:
            return RunResult(returncode=0, output=self.help_text, seconds=0.0)
        if self.timeout_on is not None and len(self.calls) - 1 == self.timeout_on:
            raise TunerError("llama-bench timed out after 1s")
        p, n, r = int(_arg(cmd, "-p")), int(_arg(cmd, "-n")), int(_arg(cmd, "-r"))
        rc = 0
        for d in (int(x) for x in _arg(cmd, "-d").split(",")):
            if d in self.fail_depths:
                on_line("CUDA error: out of memory")
                rc = 1
                break
            # like llama-bench: per depth, a pp test then a tg test (each its own record)
            for tp, tn in [(x, y) for x, y in ((p, 0), (0, n)) if x or y]:
                ctx = {"p": tp, "n": tn, "d": d, "env": env or {}, "call": len(self.calls)}
                ts = [self.sampler(ctx, i) for i in range(r)]
                rec = {
                    "build_commit": "0c1e570",
                    "backends": "CUDA",
                    "gpu_info": "Fake GPU",
                    "model_filename": "m.gguf",
                    "model_size": 1000,
                    "model_n_params": 10,
                    "n_ubatch": 512,
                    "type_k": "f16",
                    "flash_attn": 1 if "-fa" in cmd and _arg(cmd, "-fa") in ("on", "1") else 0,
                    "n_prompt": tp,
                    "n_gen": tn,
                    "n_depth": d,
                    "samples_ns": [1e9 * (tp + tn) / t for t in ts],
                    "samples_ts": ts,
                }
                on_line(json.dumps(rec))
        return RunResult(returncode=rc, output="", seconds=0.1, log_file=log_file)


def _model(tmp_path: Path) -> Path:
    m = tmp_path / "m.gguf"
    m.write_bytes(b"GGUF")
    return m


def test_run_bench_schema_commands_and_warmup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The first rep of every call is 30% slow (device.md); it must not reach the samples.
    fake = FakeBench(lambda c, i: 70.0 if i == 0 else 100.0 + i)
    monkeypatch.setattr(tuner._run, "run", fake)
    df = run_bench(
        _fake_bin(tmp_path),
        _model(tmp_path),
        depths=(0, 4096),
        pp=512,
        tg=128,
        reps=4,
        env={"GGML_TUNER_FA_RULES": "decode:0-=VEC"},
        extra_args=("-ngl", "99"),
        log_dir=tmp_path / "logs",
        label="v1",
        observe=False,
    )
    assert list(df.columns) == list(COLUMNS)
    assert sorted(zip(df["test"], df["depth"])) == [("pp512", 0), ("pp512", 4096), ("tg128", 0), ("tg128", 4096)]
    bench_calls = [c for c, _ in fake.calls if "--help" not in c]
    # one call for both tests at all depths, as a user runs llama-bench: each depth is filled once
    # and llama-bench restores that state for the second test at the same depth
    assert len(bench_calls) == 1
    pp_cmd = bench_calls[0]
    assert (_arg(pp_cmd, "-p"), _arg(pp_cmd, "-n"), _arg(pp_cmd, "-d"), _arg(pp_cmd, "-r")) == (
        "512",
        "128",
        "0,4096",
        "5",
    )
    assert _arg(pp_cmd, "-fa") == "on" and _arg(pp_cmd, "-o") == "jsonl" and pp_cmd[-2:] == ["-ngl", "99"]
    assert fake.calls[-1][1]["GGML_TUNER_FA_RULES"] == "decode:0-=VEC"
    for r in df.itertuples():
        assert r.n == 4 and r.warmup_discarded == 1 and 70.0 not in r.samples
        assert r.min_ts <= r.ci_low <= r.median_ts <= r.ci_high <= r.max_ts
        assert r.status == "ok" and r.label == "v1" and json.loads(r.env) == {"GGML_TUNER_FA_RULES": "decode:0-=VEC"}
    assert df.attrs["log_file"].endswith("v1-pp+tg.log")


def test_era_detection_and_flag_spelling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeBench(lambda c, i: 100.0, help_text=ROCWMMA_HELP)
    monkeypatch.setattr(tuner._run, "run", fake)
    b = _fake_bin(tmp_path)
    run_bench(b, _model(tmp_path), depths=(0,), tg=0, pp=8, reps=2, log_dir=tmp_path, observe=False)
    assert _arg(fake.calls[-1][0], "-fa") == "1"
    run_bench(
        b,
        _model(tmp_path),
        depths=(0,),
        tg=0,
        pp=8,
        reps=2,
        log_dir=tmp_path,
        observe=False,
        era="mma",
        flash_attn=False,
    )
    assert _arg(fake.calls[-1][0], "-fa") == "off"
    run_bench(
        b,
        _model(tmp_path),
        depths=(0,),
        tg=0,
        pp=8,
        reps=2,
        log_dir=tmp_path,
        observe=False,
        flash_attn=None,
        era="mma",
    )
    assert "-fa" not in fake.calls[-1][0]


def test_target_ci_adds_batches_until_tight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)

    def sampler(ctx: dict, i: int) -> float:
        # depth 0 is quiet; depth 4096 is noisy and needs more batches.
        return 100.0 + (rng.normal(0, 0.1) if ctx["d"] == 0 else rng.normal(0, 8.0))

    fake = FakeBench(sampler)
    monkeypatch.setattr(tuner._run, "run", fake)
    df = run_bench(
        _fake_bin(tmp_path),
        _model(tmp_path),
        depths=(0, 4096),
        pp=64,
        tg=0,
        reps=3,
        target_ci=1.0,
        max_reps=12,
        log_dir=tmp_path,
        observe=False,
    )
    quiet = df[df["depth"] == 0].iloc[0]
    noisy = df[df["depth"] == 4096].iloc[0]
    assert quiet.n == 3 and quiet.n_batches == 1 and quiet.ci_pct <= 1.0
    assert noisy.n_batches > 1 and noisy.n >= 12 - 2 and noisy.warmup_discarded == noisy.n_batches
    later = [c for c, _ in fake.calls if "--help" not in c][1:]
    assert later and all(_arg(c, "-d") == "4096" for c in later)  # only unconverged depths rerun


def test_failed_depth_is_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tuner._run, "run", FakeBench(lambda c, i: 50.0, fail_depths=(32768,)))
    df = run_bench(
        _fake_bin(tmp_path), _model(tmp_path), depths=(0, 32768), pp=0, tg=16, reps=2, log_dir=tmp_path, observe=False
    )
    ok = df[df["depth"] == 0].iloc[0]
    bad = df[df["depth"] == 32768].iloc[0]
    assert ok.status == "ok" and ok.median_ts == 50.0
    assert bad.status == "failed" and bad.n == 0 and math.isnan(bad.median_ts) and "exit" in bad.error
    assert df.attrs["errors"]


def test_timeout_is_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tuner._run, "run", FakeBench(lambda c, i: 50.0, timeout_on=1))
    df = run_bench(
        _fake_bin(tmp_path),
        _model(tmp_path),
        depths=(0,),
        pp=8,
        tg=0,
        reps=2,
        log_dir=tmp_path,
        observe=False,
        timeout=1,
    )
    assert df.iloc[0].status == "failed" and "timed out" in df.iloc[0].error


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"extra_args": ("-r", "3")}, "set by tuner bench"),
        ({"depths": (-1,)}, "depth"),
        ({"depths": ()}, "non-empty"),
        ({"pp": 0, "tg": 0}, "nothing to measure"),
        ({"target_ci": 0}, "target_ci"),
        ({"env": {"BAD NAME": "1"}}, "invalid"),
        ({"era": "volta"}, "Unknown era"),
        ({"label": "a/b"}, "label"),
        ({"bandwidth": -5.0}, "bandwidth"),
        ({"extra_args": ("-t", "100000")}, "threads must be an integer"),
        ({"extra_args": ("--threads", "100000")}, "threads must be an integer"),  # the long spelling too
        ({"extra_args": ("-t", "1", "-t", "0")}, "threads must be an integer"),  # every occurrence
    ],
)
def test_bad_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kw: dict, match: str) -> None:
    monkeypatch.setattr(tuner._run, "run", FakeBench(lambda c, i: 1.0))
    args = dict(depths=(0,), pp=8, tg=8, log_dir=tmp_path, observe=False, era="mma")
    args.update(kw)
    with pytest.raises(UsageError, match=match):
        run_bench(_fake_bin(tmp_path), _model(tmp_path), **args)


def test_missing_binary_and_model(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="llama-bench not found"):
        run_bench(tmp_path, _model(tmp_path), log_dir=tmp_path)
    with pytest.raises(UsageError, match="does not exist"):
        run_bench(_fake_bin(tmp_path), tmp_path / "nope.gguf", log_dir=tmp_path)


def test_roofline_columns_nan_with_note_without_arch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tuner._run, "run", FakeBench(lambda c, i: 10.0))
    df = run_bench(
        _fake_bin(tmp_path), _model(tmp_path), depths=(0,), pp=8, tg=8, reps=2, log_dir=tmp_path, observe=False
    )
    assert df["roofline_pct"].isna().all() and (df["roofline_note"] != "").all()


def _fake_roofline(monkeypatch: pytest.MonkeyPatch) -> list:
    calls: list = []
    fake = types.ModuleType("tuner.targets.roofline")
    fake.KV_TYPES = {"f16": 2.0}  # type: ignore[attr-defined]

    def bytes_per_token(model, depth, kv_type="f16", **kw):  # type: ignore[no-untyped-def]
        calls.append(("bpt", depth, kv_type))
        return {"total_bytes": 1e6}

    def estimate(arch, model, depths, pp=512, tg=128, **kw):  # type: ignore[no-untyped-def]
        if arch == "nope":
            raise UsageError("Unknown arch 'nope'.")
        calls.append(("est", arch, tuple(depths), pp, tg, kw.get("bandwidth")))
        test = f"pp{pp}" if pp else f"tg{tg}"
        return [{"test": test, "depth": depths[0], "bound_tps": 400.0 if pp else 200.0, "limit": "memory: 1 GB/s"}]

    fake.bytes_per_token = bytes_per_token  # type: ignore[attr-defined]
    fake.estimate = estimate  # type: ignore[attr-defined]
    import tuner.measure.bench

    monkeypatch.setattr(tuner.measure.bench, "roofline", fake)
    return calls


def test_roofline_columns_from_arch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_roofline(monkeypatch)
    monkeypatch.setattr(tuner._run, "run", FakeBench(lambda c, i: 50.0))
    df = run_bench(
        _fake_bin(tmp_path),
        _model(tmp_path),
        depths=(4096,),
        pp=8,
        tg=8,
        reps=2,
        log_dir=tmp_path,
        observe=False,
        arch="sm_90",
    )
    tg = df[df["phase"] == "tg"].iloc[0]
    pp = df[df["phase"] == "pp"].iloc[0]
    assert tg.roofline_tps == 200.0 and tg.roofline_pct == pytest.approx(25.0) and tg.bytes_per_token == 1e6
    assert pp.roofline_pct == pytest.approx(12.5) and "model estimate" in pp.roofline_note
    assert ("bpt", 4096 + 4, "f16") in calls  # mean depth of the test, KV type from llama-bench
    with pytest.raises(UsageError, match="Unknown arch"):
        run_bench(
            _fake_bin(tmp_path), _model(tmp_path), depths=(0,), pp=8, tg=8, log_dir=tmp_path, observe=False, arch="nope"
        )


def test_roofline_bandwidth_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_roofline(monkeypatch)
    monkeypatch.setattr(tuner._run, "run", FakeBench(lambda c, i: 50.0))
    df = run_bench(
        _fake_bin(tmp_path),
        _model(tmp_path),
        depths=(0,),
        pp=8,
        tg=8,
        reps=2,
        log_dir=tmp_path,
        observe=False,
        bandwidth=100.0,
    )
    tg = df[df["phase"] == "tg"].iloc[0]
    assert tg.roofline_tps == pytest.approx(100e9 / 1e6) and "GB/s (given)" in tg.roofline_note
    pp = df[df["phase"] == "pp"].iloc[0]
    assert math.isnan(pp.roofline_pct) and "needs --arch" in pp.roofline_note


def test_save_load_roundtrip_and_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tuner._run, "run", FakeBench(lambda c, i: 100.0 + i))
    df = run_bench(
        _fake_bin(tmp_path),
        _model(tmp_path),
        depths=(0, 256),
        pp=8,
        tg=8,
        reps=3,
        log_dir=tmp_path,
        observe=False,
        label="x",
    )
    files = save_results(df, tmp_path / "out" / "x")
    assert files[0].suffix == ".jsonl"
    for f in files:
        back = load_results(f)
        assert list(back["samples"].iloc[0]) == list(df["samples"].iloc[0])
        assert back["median_ts"].tolist() == pytest.approx(df["median_ts"].tolist())
    table = render_table(df)
    assert "| x " in table and "tg8" in table
    (tmp_path / "raw.jsonl").write_text((DATA / "llama-bench-mma-cpu.jsonl").read_text())
    raw = load_results(
        tmp_path / "raw.jsonl"
    )  # llama-bench's own -o jsonl is read too (tests/unit/measure/test_frames.py)
    assert set(raw["test"]) == {"pp64"} and raw["n"].tolist() == [3, 3]
    with pytest.raises(UsageError, match="holds no llama-bench results"):
        (tmp_path / "notes.txt").write_text("not a benchmark\n")
        load_results(tmp_path / "notes.txt")


def test_interleaved_detects_and_corrects_drift(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The machine slows down 3% per llama-bench call; the candidate is truly 5% faster.
    def sampler(ctx: dict, i: int) -> float:
        slow = 1.0 - 0.03 * ctx["call"]
        base = 105.0 if ctx["env"].get("CAND") else 100.0
        return base * slow * (1 + 0.001 * (i % 3))

    monkeypatch.setattr(tuner._run, "run", FakeBench(sampler))
    b = _fake_bin(tmp_path)
    res = run_interleaved(
        [BenchTarget(label="cand", bin_dir=b, env={"CAND": "1"})],
        BenchTarget(label="base", bin_dir=b),
        _model(tmp_path),
        log_dir=tmp_path,
        depths=(0,),
        pp=8,
        tg=0,
        reps=5,
        observe=False,
    )
    dr = res.drift.iloc[0]
    assert dr.flagged and dr.drift_pct > 5 * dr.noise_pct
    assert sorted(res.anchors["anchor_index"].unique()) == [0, 1]
    cand = res.frames["cand"].iloc[0]
    base = res.frames["base"].iloc[0]
    assert cand.drift_corrected and cand.anchor_ratio > 1.0
    assert cand.median_ts / base.median_ts == pytest.approx(1.05, abs=0.01)
    assert base.n == 10 and base.n_batches == 2


def test_interleaved_no_drift_leaves_samples(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(1)
    monkeypatch.setattr(tuner._run, "run", FakeBench(lambda c, i: 100.0 + rng.normal(0, 2)))
    b = _fake_bin(tmp_path)
    res = run_interleaved(
        [BenchTarget(label="c", bin_dir=b)],
        BenchTarget(label="a", bin_dir=b),
        _model(tmp_path),
        log_dir=tmp_path,
        depths=(0,),
        pp=8,
        tg=0,
        reps=5,
        observe=False,
    )
    assert not res.drift.iloc[0].flagged and not res.frames["c"].iloc[0].drift_corrected
    with pytest.raises(UsageError, match="distinct"):
        run_interleaved(
            [BenchTarget(label="a", bin_dir=b)], BenchTarget(label="a", bin_dir=b), _model(tmp_path), log_dir=tmp_path
        )


# --------------------------------------------------------------------------- observers


class _FakeNvml:
    class _U:
        gpu = 87

    class _M:
        used = 3 * 2**30

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUtilizationRates(self, h: int) -> object:
        return self._U()

    def nvmlDeviceGetMemoryInfo(self, h: int) -> object:
        return self._M()


def test_observer_without_gpu_gives_nan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    assert find_gpu_probe() is None
    with Observer(interval=0.01) as obs:
        sum(range(10000))
    s = obs.summary()
    assert s.n_samples >= 2 and math.isnan(s.gpu_util_mean) and math.isnan(s.gpu_mem_mb) and s.gpu_source == ""


def test_observer_reads_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml())
    with Observer(interval=0.01) as obs:
        import time

        time.sleep(0.05)
    s = obs.summary()
    assert s.gpu_util_mean == 87 and s.gpu_source == "nvml"
    assert s.gpu_mem_mb == 0.0  # memory is counted above the level at start


def test_observer_counts_child_cpu() -> None:
    import subprocess
    import time

    with Observer(interval=0.05) as idle:
        time.sleep(0.2)
    assert idle.summary().cpu_util_max < 5  # only children count, not this process
    with Observer(interval=0.05) as obs:
        # A real busy child: the observer's whole point is to see the llama-bench process tree.
        p = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<0.6: pass"])
        p.wait()
        time.sleep(0.06)
    s = obs.summary()
    assert s.cpu_util_mean > 5 and s.cpu_util_max > 15  # lenient: the CI box is shared


def test_parse_real_h100_llama_bench() -> None:
    recs = parse_bench_jsonl((DATA / "h100" / "llama-bench-tg-default.jsonl").read_text())
    assert [(r["test"], r["n_depth"], len(r["samples_ts"])) for r in recs] == [
        ("tg128", d, 6) for d in (0, 4096, 16384, 32768)
    ]
    assert all("H100" in r["gpu_info"] and r["backends"] == "CUDA" for r in recs)
    # decode slows down with depth on the real GPU (KV reads grow): the parse kept the order
    meds = [sorted(r["samples_ts"])[3] for r in recs]
    assert meds == sorted(meds, reverse=True)


def _marks(obs: Observer, spec: list[tuple[float, str, float, dict]]) -> None:
    from tuner.measure.observe import Mark

    obs.marks = [Mark(t=t, tag=tag, cpu_s=cpu, threads=th) for t, tag, cpu, th in spec]


def test_timed_windows_are_the_repetitions_after_the_first() -> None:
    from tuner.measure.bench import _test_observation

    obs = Observer(gpu=False)
    # warm-up and depth fill (not timed), then three timed repetitions of 1 s each, then the JSONL line
    _marks(
        obs,
        [
            (1.0, "warmup generation run", 0.0, {}),
            (2.0, "depth run 1/3", 5.0, {}),
            (3.0, "generation run 1/3", 6.0, {(1, 1): 0.0, (1, 2): 0.0}),
            (4.0, "generation run 2/3", 8.0, {(1, 1): 1.0, (1, 2): 1.0}),
            (5.0, "generation run 3/3", 9.5, {(1, 1): 2.0, (1, 2): 1.5}),
            (6.0, "result", 11.0, {(1, 1): 3.0, (1, 2): 2.0, (1, 3): 0.1}),
        ],
    )
    s = _test_observation(obs, 0.5, 6.0)
    # repetitions 2 and 3: 3 CPU seconds in 2 s; the busiest thread 2 s of them (thread 3 born inside counts from 0)
    assert math.isclose(s.cpu_util_mean, 150.0) and math.isclose(s.cpu_core_max, 100.0)
    single = Observer(gpu=False)
    _marks(single, [(1.0, "prompt run 1/1", 0.0, {}), (3.0, "result", 1.0, {})])
    assert math.isclose(_test_observation(single, 0.0, 3.0).cpu_util_mean, 50.0)  # -r 1: its only repetition counts
    old = Observer(gpu=False)
    old.samples = [(1.5, 80.0, math.nan, math.nan)]
    none = _test_observation(old, 1.2, 2.5)  # no progress marks (an old binary): the whole window's samples
    assert none.cpu_util_mean == 80.0 and math.isnan(none.cpu_core_max)
    assert math.isnan(obs.timed_summary([]).cpu_util_mean)
    # timed repetitions of 8 ms in all (CI's pp64@d256 read 0.0%): below the CPU clock's resolution,
    # so the whole test's window (its samples since the previous test's result) stands instead
    short = Observer(gpu=False)
    _marks(
        short,
        [
            (0.5, "result", 0.0, {}),
            (1.0, "prompt run 1/3", 0.0, {}),
            (1.004, "prompt run 2/3", 0.0, {}),
            (1.008, "prompt run 3/3", 0.0, {}),
            (1.012, "result", 0.0, {}),
        ],
    )
    short.samples = [(0.9, 95.0, math.nan, math.nan)]
    assert _test_observation(short, 0.5, 1.012).cpu_util_mean == 95.0
    # a call's first test: before its first mark llama-bench was loading the model (a cold page cache: 0% of a
    # CPU); that is not the test's CPU use, and where its own 12 ms saw no CPU-clock tick it is unknown, not 0.0
    first = Observer(gpu=False)
    _marks(first, [(m.t, m.tag, 0.0, {}) for m in short.marks[1:]])
    first.samples = [(0.9, 0.0, math.nan, math.nan)]
    unknown = _test_observation(first, 0.5, 1.012)
    assert math.isnan(unknown.cpu_util_mean) and math.isnan(unknown.cpu_core_max)
    _marks(first, [(m.t, m.tag, 0.01 * (m.tag == "result"), {}) for m in short.marks[1:]])  # one tick: 10 ms in 12
    assert math.isclose(_test_observation(first, 0.5, 1.012).cpu_util_mean, 100.0 * 0.01 / 0.012)
    # ... and where the sampler saw nothing inside the test either (CI's tg8@d0 on an idle box: "—" in the
    # report), the marks' exact CPU times over the whole test stand, from the previous test's result on
    tiny = Observer(gpu=False)
    _marks(
        tiny,
        [
            (0.99, "result", 0.0, {}),
            (1.0, "generation run 1/3", 0.005, {}),
            (1.02, "generation run 2/3", 0.025, {}),
            (1.04, "generation run 3/3", 0.045, {}),
            (1.06, "result", 0.065, {}),
        ],
    )
    assert math.isclose(_test_observation(tiny, 0.99, 1.06).cpu_util_mean, 100.0 * 0.065 / 0.07)


def test_observer_marks_find_the_busy_thread_of_a_real_child() -> None:
    import subprocess

    code = (
        "import threading, time\n"
        "def spin():\n    t = time.time()\n    while time.time() - t < 0.8: pass\n"
        "th = threading.Thread(target=spin); th.start(); time.sleep(0.8); th.join()"
    )
    with Observer(interval=0.05, gpu=False) as obs:
        p = subprocess.Popen([sys.executable, "-c", code])
        import time

        time.sleep(0.2)
        obs.mark("start")
        time.sleep(0.4)
        obs.mark("end")
        p.wait()
    s = obs.timed_summary([(obs.marks[0], obs.marks[1])])
    # one spinning thread and one sleeping: the busiest thread is nearly all of the total (lenient: shared CI box)
    assert s.cpu_core_max > 30 and s.cpu_util_mean < 130 and s.cpu_core_max >= 0.8 * s.cpu_util_mean
    assert len(obs.marks[0].threads) >= 2 and math.isnan(s.gpu_util_mean)
