"""Config-only knobs on the real CPU build: --cpu-mask really pins llama-bench, threads' legal values
follow the mask, and the spaces' fixed defaults are the real llama-bench's. About 15 s on 2 cores."""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path

import psutil
import pytest

from tuner import _run
from tuner.measure.bench import run_bench
from tuner.plan.derive import space_for_run
from tuner.plan.space import load_space

pytestmark = pytest.mark.integration


def _bench_affinities(bin_dir: Path, model: Path, out: Path, cpus: tuple[int, ...] | None) -> tuple[set, object]:
    """Run one small llama-bench; return the CPU affinities its process had (read from /proc via
    psutil while it ran) and the result frame."""
    seen: set[tuple[int, ...]] = set()
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for p in psutil.Process().children(recursive=True):
                try:
                    if p.name() == "llama-bench":
                        seen.add(tuple(sorted(p.cpu_affinity())))
                except psutil.Error:
                    pass
            time.sleep(0.02)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        df = run_bench(
            bin_dir,
            model,
            depths=(0,),
            pp=64,
            tg=16,
            reps=2,
            extra_args=("-t", "1"),
            log_dir=out,
            label="pinned" if cpus else "free",
            observe=False,
            cpus=cpus,
        )
    finally:
        stop.set()
        t.join()
    return seen, df


def test_cpu_mask_pins_every_llama_bench_process(cpu_build, tiny_model: Path, tmp_path: Path) -> None:
    everything = tuple(sorted(os.sched_getaffinity(0)))
    seen, df = _bench_affinities(cpu_build.bin_dir, tiny_model, tmp_path, (0,))
    assert seen == {(0,)}, seen
    assert (df["status"] == "ok").all() and (df["median_ts"] > 0).all()
    assert all(
        c.split()[1:3] == ["-c", "0"] and "taskset" in c.split()[0] for c in df["cmd"]
    )  # the logged command reproduces it
    if len(everything) > 1:  # the control: without a mask llama-bench may use every CPU
        free, _ = _bench_affinities(cpu_build.bin_dir, tiny_model, tmp_path, None)
        assert free == {everything}, free


def test_threads_legal_values_follow_the_mask(tiny_model: Path) -> None:
    sp = load_space("cpu", "mma")
    masked, legal = space_for_run(sp, cpu_mask=(0,), model=tiny_model, gpu=False)
    assert masked.knob("threads").choices == ("default", 1) and masked.knob("threads").high == 1
    assert "--cpu-mask 0" in legal["threads"].why
    free, _ = space_for_run(sp, cpu_mask=None, model=tiny_model, gpu=False)
    assert free.knob("threads").high == len(os.sched_getaffinity(0))


def test_fixed_knob_defaults_are_the_real_llama_bench_defaults(cpu_build) -> None:
    """An untouched space measures upstream: every fixed-list bench flag defaults to what llama-bench
    --help says; derived ones (threads, -ngl) pass no flag at all."""
    help_text = _run.run([str(cpu_build.bin_dir / "llama-bench"), "--help"], check=False, timeout=60).output
    defaults = {
        m.group(1): m.group(2)
        for m in re.finditer(r"^\s+(-\w+), --[\w-]+ <[^>]*>\s+\(default: ([^)]*)\)", help_text, re.M)
    }
    assert {"-b", "-ub", "-nkvo", "-ngl", "-t"} <= set(defaults), defaults
    for arch in ("sm_90", "sm_89", "gfx1151", "cpu"):
        for k in load_space(arch, "mma").runtime_knobs:
            if k.kind != "bench_flag" or k.meta["flag"] not in ("-b", "-ub", "-nkvo"):
                continue
            assert str(k.default) == defaults[k.meta["flag"]], (arch, k.name, k.default, defaults[k.meta["flag"]])
