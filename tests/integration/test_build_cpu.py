"""Real builds on this machine: a toy CMake project (seconds) and llama-bench from tree A (minutes, cached)."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest

from tuner import _run
from tuner.builder.cmake import build_variant, ninja_log_lines, parse_ninja_log
from tuner.errors import TunerError
from tuner.plan.variant import RenderedVariant

pytestmark = pytest.mark.integration

DATA = Path(__file__).resolve().parent.parent / "data" / "build"
TOY = DATA / "toy"
TU = "ggml/src/ggml-cuda/fattn.cu"


def toy_rv(*, rows: int | None = None, core: str | None = None) -> RenderedVariant:
    files = {"CMakeLists.txt": (TOY / "CMakeLists.txt").read_text() + (DATA / "toy_hook.cmake").read_text()}
    if core is not None:
        files["core.cpp"] = core
    return RenderedVariant(
        arch="cpu",
        variant="toy",
        era="mma",
        source_id="toy",
        source_root=TOY,
        defines={"TOY_TILE": "128", "CMAKE_BUILD_RPATH_USE_ORIGIN": "ON"},
        patch=f"hook+{core!r}",
        files=files,
        tu_headers={TU: f"#define TOY_ROWS {rows}\n"} if rows is not None else {},
    )


def run_exe(exe: Path, *args: str) -> str:
    return _run.run([exe, *args], cwd=exe.parent.parent, timeout=60).output


def test_toy_build_runs_and_rebuilds_one_tu(isolated_home: Path) -> None:
    base = build_variant(toy_rv(), targets=["llama-bench"], jobs=2)
    assert not base.cached and base.meta["rebuilt_count"] == 3
    assert json.loads(run_exe(base.exe("llama-bench"))) == {"tile": 128, "rows": 1}

    before = ninja_log_lines(base.build_dir)
    cand = build_variant(toy_rv(rows=7), targets=["llama-bench"], jobs=2)
    assert cand.build_dir == base.build_dir and cand.bin_dir != base.bin_dir
    # the changed TU and its shared library are rebuilt; the executable linking it is not (LINK_DEPENDS_NO_SHARED)
    relinked = {o for o, ln in parse_ninja_log((base.build_dir / ".ninja_log").read_text()) if ln not in before}
    assert not any(o.startswith("bin/llama-bench") for o in relinked) and any("toy-core" in o for o in relinked)
    assert cand.meta["rebuilt_tus"] == ["CMakeFiles/toy-core.dir/ggml/src/ggml-cuda/fattn.cu.o"]
    assert json.loads(run_exe(cand.exe("llama-bench"))) == {"tile": 128, "rows": 7}
    assert json.loads(run_exe(base.exe("llama-bench"))) == {"tile": 128, "rows": 1}  # artifacts are copies

    check = build_variant(toy_rv(rows=7), compile_only=True, objects=[TU], jobs=2)
    assert check.compile_only and check.cached  # nothing to recompile for the same header


def test_toy_broken_build_is_recorded(isolated_home: Path) -> None:
    rv = toy_rv(core="int toy_tile() { return TOY_TILE }\n")
    with pytest.raises(TunerError) as info:
        build_variant(rv, targets=["llama-bench"], jobs=2)
    msg = str(info.value)
    assert rv.short in msg
    log = Path(re.search(r"Full log: (\S+)\.", msg).group(1))
    assert log.is_file() and "expected ';'" in msg.replace("\u2018", "'").replace("\u2019", "'")
    root = isolated_home / "builds" / rv.key
    rec = json.loads((root / "build.json").read_text())
    assert rec["status"] == "failed" and rec["log"] == str(log)
    assert not (root / "artifacts").exists()


def test_llama_bench_cpu_build_relocatable_and_cached(
    cpu_build, tree_a, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tuner.plan.render import render_variant

    rv = render_variant(tree_a, "cpu", "cpu", local_archs=[])
    targets = ("llama-bench", "test-backend-ops", "llama-quantize")
    b = build_variant(rv, targets=targets)  # the session fixture built it (~6 min the first time)
    rec = json.loads((b.bin_dir.parent / "build.json").read_text())
    assert rec["status"] == "ok" and rec["toolchain"]["cxx"].startswith(("c++", "g++", "x86_64"))
    dyn = _run.run(["readelf", "-d", b.exe("llama-bench")], timeout=60).output
    assert "$ORIGIN" in dyn and str(b.build_dir) not in dyn

    moved = tmp_path / "moved"
    shutil.copytree(b.bin_dir, moved, symlinks=True)
    assert "usage:" in run_exe(moved / "llama-bench", "--help")
    assert "Available devices" in run_exe(moved / "llama-bench", "--list-devices")

    def fail_on_call(*args, **kwargs):
        raise AssertionError("a cached build must not start a process")

    monkeypatch.setattr(_run, "run", fail_on_call)
    t0 = time.monotonic()
    again = build_variant(rv, targets=targets)
    assert again.cached and again.bin_dir == b.bin_dir and time.monotonic() - t0 < 1.0


def test_two_processes_build_one_variant_once(tmp_path: Path) -> None:
    """Two workers on one host ask for the same build at once: one builds, the other waits and reuses it."""
    import os
    import subprocess
    import sys

    script = (
        "import sys, json; sys.path.insert(0, sys.argv[1]);"
        "from test_build_cpu import toy_rv; from tuner.builder.cmake import build_variant;"
        "b = build_variant(toy_rv(rows=3), targets=['llama-bench'], jobs=1);"
        "print(json.dumps({'cached': b.cached, 'bin': str(b.bin_dir)}))"
    )
    env = {**os.environ, "TUNER_HOME": str(tmp_path / "home")}
    here = str(Path(__file__).parent)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, here], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in outs]
    got = [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]
    assert sorted(g["cached"] for g in got) == [False, True]  # built exactly once
    assert got[0]["bin"] == got[1]["bin"]
