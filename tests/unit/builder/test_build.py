"""Unit tests for tuner.builder.cmake: no real compiler or CMake runs (tuner._run.run is faked)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import types
from pathlib import Path

import pytest
from click.testing import CliRunner
from packaging.version import Version
from scikit_build_core.cmake import CMake

from tuner import _run
from tuner.builder import cmake as B
from tuner.cli import cli
from tuner.cli.build_cmd import parse_sets
from tuner.errors import TunerError, UsageError
from tuner.plan.variant import RenderedVariant

DATA = Path(__file__).resolve().parents[2] / "data" / "build"
TOY = DATA / "toy"
TU = "ggml/src/ggml-cuda/fattn.cu"
HOOKED_CMAKE = (TOY / "CMakeLists.txt").read_text() + (DATA / "toy_hook.cmake").read_text()


def make_rv(
    root: Path = TOY, *, tu: str | None = None, patch: str = "hook", defines=None, era="mma"
) -> RenderedVariant:
    return RenderedVariant(
        arch="cpu",
        variant="toy",
        era=era,
        source_id="toy",
        source_root=root,
        defines=defines or {"TOY_TILE": "64"},
        patch=patch,
        files={"CMakeLists.txt": HOOKED_CMAKE},
        tu_headers={TU: tu} if tu is not None else {},
    )


def fail_on_call(*args, **kwargs):
    raise AssertionError(f"unexpected process start: {args}")


class FakeRun:
    """Pretends to be cmake configure / cmake --build / --version, recording the calls."""

    def __init__(self, fail_build: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.fail_build = fail_build

    def __call__(self, cmd, *, cwd=None, env=None, log_file=None, timeout=None, check=True, on_line=None, what=None):
        args = [os.fspath(c) for c in cmd]
        self.calls.append(args)
        if args[-1] == "--version":
            return _run.RunResult(returncode=0, output=f"{Path(args[0]).name} version 1.0\n", seconds=0.0)
        if log_file is not None:
            log_file.parent.mkdir(parents=True, exist_ok=True)
            log_file.write_text("$ " + " ".join(args) + "\n")
        if "--build" in args:
            bdir = Path(args[args.index("--build") + 1])
            if self.fail_build:
                raise TunerError(f"{what} failed with exit code 1. Full log: {log_file}. Last lines:\nerror: boom")
            if on_line:
                on_line("[1/2] Building CXX object x.o")
                on_line("[2/2] Linking CXX executable bin/llama-bench")
            (bdir / "bin").mkdir(exist_ok=True)
            for t in args[args.index("--target") + 1 : args.index("--parallel")]:
                if t.endswith(".o"):
                    continue
                (bdir / "bin" / t).write_text("#!/bin/sh\n")
            (bdir / "bin" / "libtoy.so.1").write_text("lib")
            if not (bdir / "bin" / "libtoy.so").exists():
                os.symlink("libtoy.so.1", bdir / "bin" / "libtoy.so")
            with open(bdir / ".ninja_log", "a") as fh:
                fh.write(f"0\t10\t{time.time_ns()}\tCMakeFiles/toy.dir/fattn.cu.o\tabc\n")
            return _run.RunResult(returncode=0, output="", seconds=0.1, log_file=log_file)
        bdir = Path(next(a[2:] for a in args if a.startswith("-B")))
        src = Path(next(a[2:] for a in args if a.startswith("-S")))
        (bdir / "build.ninja").write_text("# fake\n")
        (bdir / ".ninja_log").write_text("# ninja log v5\n")
        (bdir / "compile_commands.json").write_text(
            json.dumps([{"directory": str(bdir), "file": str(src / TU), "output": "CMakeFiles/toy.dir/fattn.cu.o"}])
        )
        return _run.RunResult(returncode=0, output="", seconds=0.1, log_file=log_file)


@pytest.fixture()
def fake_tools(monkeypatch: pytest.MonkeyPatch, isolated_home: Path) -> Path:
    tools = B.BuildTools(
        cmake=CMake(version=Version("3.31.0"), cmake_path=Path("/usr/bin/true")), ninja=Path("/usr/bin/true")
    )
    monkeypatch.setattr(B, "find_build_tools", lambda *a, **k: tools)
    B._version_line.cache_clear()
    yield isolated_home
    B._version_line.cache_clear()


def test_parse_ninja_progress() -> None:
    assert B.parse_ninja_progress("[57/145] Building CUDA object x.o") == (57, 145)
    assert B.parse_ninja_progress("-- Configuring done") is None


def test_parse_ninja_log_fixture() -> None:
    entries = B.parse_ninja_log((DATA / "ninja_log_v5.txt").read_text())
    assert [o for o, _ in entries] == ["ggml/CMakeFiles/a.dir/a.c.o", "bin/llama-bench"]


def test_rebuilt_objects_are_new_log_lines(tmp_path: Path) -> None:
    log = tmp_path / ".ninja_log"
    log.write_text((DATA / "ninja_log_v5.txt").read_text())
    before = B.ninja_log_lines(tmp_path)
    with open(log, "a") as fh:
        fh.write("0\t9\t1800000000000000000\tggml/CMakeFiles/b.dir/b.cu.o\tff\n1\t2\t18\tbin/llama-bench\tee\n")
    assert B.rebuilt_objects(tmp_path, before) == ["ggml/CMakeFiles/b.dir/b.cu.o"]


def test_default_check_objects_per_era() -> None:
    mma = B.default_check_objects(make_rv(tu="#define X 1\n"))
    assert mma[0] == "ggml/src/ggml-cuda/fattn.cu"
    assert "ggml/src/ggml-cuda/template-instances/fattn-mma-f16-instance-ncols1_16-ncols2_4.cu" in mma
    assert "ggml/src/ggml-cuda/template-instances/fattn-tile-instance-dkq64-dv64.cu" in mma
    split = dataclasses.replace(
        make_rv(tu="#define X 1\n"),
        variant="cuda",
        files={"ggml/src/ggml-cuda/CMakeLists.txt": "if (GGML_TUNER_TU_DIR)\n  # template-instances/split/\nendif()\n"},
    )
    # the CUDA hook compiles per-head-size TUs instead of the whole instance, so its D64 TU is checked
    assert B.default_check_objects(split)[:3] == [
        "ggml/src/ggml-cuda/fattn.cu",
        "ggml/src/ggml-cuda/template-instances/fattn-tile-instance-dkq64-dv64.cu",
        "ggml/src/ggml-cuda/template-instances/split/fattn-mma-f16-instance-ncols1_16-ncols2_4-dkq64.cu",
    ]
    hip = dataclasses.replace(split, variant="hip")  # ggml-hip's hook is not split
    assert "ggml/src/ggml-cuda/template-instances/fattn-mma-f16-instance-ncols1_16-ncols2_4.cu" in (
        B.default_check_objects(hip)
    )
    roc = B.default_check_objects(make_rv(era="rocwmma"))
    assert roc == [
        "ggml/src/ggml-cuda/fattn.cu",
        "ggml/src/ggml-cuda/fattn-tile-f16.cu",
        "ggml/src/ggml-cuda/template-instances/fattn-vec-f16-instance-hs64-f16-f16.cu",
    ]


def test_prepare_src_links_unchanged_and_copies_patched(tmp_path: Path) -> None:
    rv = make_rv()
    dest = tmp_path / "src"
    (tmp_path / "src.partial").mkdir()  # an interrupted earlier copy
    (tmp_path / "src.partial" / "junk").write_text("x")
    B._prepare_src(rv, dest)
    assert not (tmp_path / "src.partial").exists() and not (dest / "junk").exists()
    assert (dest / "main.cpp").stat().st_ino == (TOY / "main.cpp").stat().st_ino  # hard link
    assert (dest / "CMakeLists.txt").read_text() == HOOKED_CMAKE
    assert (dest / "CMakeLists.txt").stat().st_ino != (TOY / "CMakeLists.txt").stat().st_ino
    assert "GGML_TUNER_TU_DIR" not in (TOY / "CMakeLists.txt").read_text()  # pristine untouched


def test_prepare_src_rejects_escaping_path(tmp_path: Path) -> None:
    rv = RenderedVariant(
        arch="cpu",
        variant="toy",
        era="mma",
        source_id="t",
        source_root=TOY,
        defines={},
        patch="p",
        files={"../evil.txt": "x"},
    )
    with pytest.raises(UsageError, match="leaves the source tree"):
        B._prepare_src(rv, tmp_path / "src")


def test_tu_headers_rewritten_only_when_changed(tmp_path: Path) -> None:
    src, tu = tmp_path / "src", tmp_path / "tu"
    B._prepare_src(make_rv(), src)
    assert B._write_tu_headers(make_rv(tu="#define TOY_ROWS 3\n"), src, tu) == [TU]
    header = tu / "fattn.h"
    mtime = header.stat().st_mtime_ns
    assert B._write_tu_headers(make_rv(tu="#define TOY_ROWS 3\n"), src, tu) == []
    assert header.stat().st_mtime_ns == mtime
    assert B._write_tu_headers(make_rv(), src, tu) == [TU]  # back to upstream: empty header
    assert header.read_text() == ""
    with pytest.raises(UsageError, match="not a file"):
        B._write_tu_headers(
            RenderedVariant(
                arch="cpu",
                variant="t",
                era="mma",
                source_id="t",
                source_root=TOY,
                defines={},
                patch="",
                files={},
                tu_headers={"nope.cu": "x"},
            ),
            src,
            tu,
        )


def test_tu_headers_accept_and_reset_split_tus(tmp_path: Path) -> None:
    """Split TUs exist only after configure: their keys are valid before, and all get a header (reset to '')."""
    src, tu = tmp_path / "src", tmp_path / "tu"
    inst = src / "ggml/src/ggml-cuda/template-instances"
    inst.mkdir(parents=True)
    (inst / "fattn-mma-f16-instance-ncols1_2-ncols2_4.cu").write_text(
        "DECL_FATTN_MMA_F16_CASE(64, 64, 2, 4);\nDECL_FATTN_MMA_F16_CASE(128, 128, 2, 4);\n"
    )
    d64 = "ggml/src/ggml-cuda/template-instances/split/fattn-mma-f16-instance-ncols1_2-ncols2_4-dkq64.cu"
    rv = dataclasses.replace(make_rv(), tu_headers={d64: "#define X 1\n"})
    assert len(B._write_tu_headers(make_rv(), src, tu)) == 3  # first write: the instance and both split TUs
    assert B._write_tu_headers(rv, src, tu) == [d64]
    assert (tu / "fattn-mma-f16-instance-ncols1_2-ncols2_4-dkq64.h").read_text() == "#define X 1\n"
    assert (tu / "fattn-mma-f16-instance-ncols1_2-ncols2_4-dkq128.h").read_text() == ""
    assert B._write_tu_headers(dataclasses.replace(rv, tu_headers={}), src, tu) == [d64]  # a later candidate
    assert (tu / "fattn-mma-f16-instance-ncols1_2-ncols2_4-dkq64.h").read_text() == ""
    with pytest.raises(UsageError, match="not a file"):  # a head size the instance does not declare
        B._write_tu_headers(dataclasses.replace(rv, tu_headers={d64.replace("dkq64", "dkq96"): "x"}), src, tu)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"targets": ["llama bench"]}, "not a CMake target"),
        ({"targets": []}, "No build targets"),
        ({"jobs": 0}, "--jobs"),
        ({"objects": ["a.cu"]}, "only applies"),
        ({"compile_only": True, "objects": ["/abs/a.cu"]}, "relative"),
    ],
)
def test_bad_arguments_are_usage_errors(fake_tools: Path, monkeypatch: pytest.MonkeyPatch, kw, match) -> None:
    monkeypatch.setattr(_run, "run", fail_on_call)
    with pytest.raises(UsageError, match=match):
        B.build_variant(make_rv(), **kw)


def test_build_then_cached_without_any_process(fake_tools: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeRun()
    monkeypatch.setattr(_run, "run", fake)
    rv = make_rv(tu="#define TOY_ROWS 2\n")
    b = B.build_variant(rv, targets=["llama-bench"], jobs=2)
    assert not b.cached
    # the folder this process holds: the artifact link's target at the time
    assert b.bin_dir == (fake_tools / "builds" / rv.key / "artifacts" / rv.artifact_key).resolve() / "bin"
    assert (b.bin_dir / "llama-bench").is_file() and (b.bin_dir / "libtoy.so").is_symlink()
    configure = next(c for c in fake.calls if any(a.startswith("-S") for a in c))
    assert "-GNinja" in configure and "-DCMAKE_BUILD_TYPE:STRING=Release" in configure
    assert f"-DGGML_TUNER_TU_DIR:PATH={fake_tools / 'builds' / rv.key / 'tu'}" in configure
    assert "-DCMAKE_BUILD_RPATH_USE_ORIGIN=ON" in configure
    rec = json.loads((b.bin_dir.parent / "build.json").read_text())
    assert rec["status"] == "ok" and rec["rebuilt_tus"] == ["CMakeFiles/toy.dir/fattn.cu.o"]
    assert rec["toolchain"]["cmake"] == "true version 1.0" and rec["targets"] == ["llama-bench"]

    monkeypatch.setattr(_run, "run", fail_on_call)
    t0 = time.monotonic()
    again = B.build_variant(rv, targets=["llama-bench"])
    assert again.cached and time.monotonic() - t0 < 0.5
    assert again.build_id == b.build_id and again.bin_dir == b.bin_dir


def test_second_candidate_reuses_configure(fake_tools: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeRun()
    monkeypatch.setattr(_run, "run", fake)
    B.build_variant(make_rv(tu="#define TOY_ROWS 2\n"), targets=["llama-bench"])
    n_configure = sum(1 for c in fake.calls if any(a.startswith("-S") for a in c))
    b2 = B.build_variant(make_rv(tu="#define TOY_ROWS 3\n"), targets=["llama-bench"])
    assert sum(1 for c in fake.calls if any(a.startswith("-S") for a in c)) == n_configure == 1
    assert b2.meta["headers_changed"] == [TU] and not b2.cached


def test_failed_build_recorded_and_named(fake_tools: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_run, "run", FakeRun(fail_build=True))
    rv = make_rv()
    with pytest.raises(TunerError) as info:
        B.build_variant(rv, targets=["llama-bench"])
    assert rv.short in str(info.value) and "Full log:" in str(info.value) and "boom" in str(info.value)
    root = fake_tools / "builds" / rv.key
    rec = json.loads((root / "build.json").read_text())
    assert rec["status"] == "failed" and "boom" in rec["error"]
    assert not (root / "artifacts").exists()


def test_compile_only_builds_object_targets(fake_tools: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeRun()
    monkeypatch.setattr(_run, "run", fake)
    b = B.build_variant(make_rv(), compile_only=True, objects=[TU])
    build_call = next(c for c in fake.calls if "--build" in c)
    assert build_call[build_call.index("--target") + 1] == "CMakeFiles/toy.dir/fattn.cu.o"
    assert b.compile_only and not (b.build_dir.parent / "artifacts").exists()
    with pytest.raises(UsageError, match="not compiled by this configuration"):
        B.build_variant(make_rv(), compile_only=True, objects=["main.cc"])


def test_headers_without_hook_rejected(fake_tools: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_run, "run", FakeRun())
    rv = RenderedVariant(
        arch="cpu",
        variant="toy",
        era="mma",
        source_id="toy",
        source_root=TOY,
        defines={},
        patch="",
        files={},
        tu_headers={TU: "#define TOY_ROWS 9\n"},
    )
    with pytest.raises(UsageError, match="no GGML_TUNER_TU_DIR"):
        B.build_variant(rv, targets=["llama-bench"])


def test_parse_sets() -> None:
    assert parse_sets(["a=1", "b = 0x10"]) == {"a": 1, "b": 16}
    with pytest.raises(UsageError, match="KNOB=VALUE"):
        parse_sets(["novalue"])
    with pytest.raises(UsageError, match="integer"):
        parse_sets(["a=big"])


def test_cli_build_prints_dirs(fake_tools: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_run, "run", FakeRun())
    seen = {}

    def render_variant(source, arch, variant, *, compile_values=None, **kw):
        if compile_values is None:
            compile_values = {}
        seen.update(arch=arch, variant=variant, values=dict(compile_values), hooks=tuple(kw.get("hooks", ())))
        return make_rv()

    fake_source = types.SimpleNamespace(fetch_source=lambda spec=None: types.SimpleNamespace(spec=spec or "pinned"))
    fake_render = types.SimpleNamespace(render_variant=render_variant)
    import tuner.plan

    for pkg, name, mod in ((tuner, "source", fake_source), (tuner.plan, "render", fake_render)):
        monkeypatch.setitem(sys.modules, f"{pkg.__name__}.{name}", mod)
        monkeypatch.setattr(pkg, name, mod, raising=False)
    res = CliRunner().invoke(cli, ["build", "--arch", "cpu", "--set", "rows=3", "--targets", "llama-bench", "-j", "1"])
    assert res.exit_code == 0, res.output
    assert seen == {"arch": "cpu", "variant": "cpu", "values": {"rows": 3}, "hooks": ()}
    res = CliRunner().invoke(cli, ["build", "--arch", "cpu", "--hook", "mmq", "--targets", "llama-bench", "-j", "1"])
    assert res.exit_code == 0 and seen["hooks"] == ("mmq",)  # passed through; render_variant checks the name
    assert "bin dir" in res.output and "artifacts" in res.output and "| cached" in res.output


def test_configure_does_not_relink_dependents_of_a_changed_shared_library(
    fake_tools: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trial's TU change relinks only its own library (CMAKE_LINK_DEPENDS_NO_SHARED), and the build id does not
    depend on that configure define; a variant that sets it itself keeps its value."""
    fake = FakeRun()
    monkeypatch.setattr(_run, "run", fake)
    b = B.build_variant(make_rv(tu="#define TOY_ROWS 2\n"), targets=["llama-bench"])
    configure = next(c for c in fake.calls if any(a.startswith("-S") for a in c))
    assert "-DCMAKE_LINK_DEPENDS_NO_SHARED=ON" in configure
    assert "CMAKE_LINK_DEPENDS_NO_SHARED" not in b.meta["defines"]
    fake.calls.clear()
    own = make_rv(defines={"TOY_TILE": "64", "CMAKE_LINK_DEPENDS_NO_SHARED": "OFF"})
    B.build_variant(own, targets=["llama-bench"])
    configure = next(c for c in fake.calls if any(a.startswith("-S") for a in c))
    assert "-DCMAKE_LINK_DEPENDS_NO_SHARED=OFF" in configure and "-DCMAKE_LINK_DEPENDS_NO_SHARED=ON" not in configure


def test_a_native_build_is_not_taken_as_built_on_a_cpu_with_other_features(
    fake_tools: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A -march=native build (llama.cpp's default GGML_NATIVE) made on one CPU died of SIGILL on another that
    # shared its $TUNER_HOME: the cache must key such builds on the CPU, and recompile every object.
    from tuner.builder import records

    fake = FakeRun()
    monkeypatch.setattr(_run, "run", fake)
    monkeypatch.setattr(records, "host_isa", lambda: "x86_64-cpuA")
    rv = make_rv()  # no GGML_NATIVE define: native, as llama.cpp defaults
    first = B.build_variant(rv, targets=["llama-bench"])
    stale = first.build_dir / "CMakeFiles" / "stale.o"
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_text("cpu A's code")
    monkeypatch.setattr(records, "host_isa", lambda: "x86_64-cpuB")
    second = B.build_variant(rv, targets=["llama-bench"])
    assert not second.cached and second.build_id != first.build_id
    assert not stale.exists()  # a new build folder: Ninja would have kept cpu A's objects (same commands)
    assert sum(1 for c in fake.calls if any(a.startswith("-S") for a in c)) == 2
    # back on cpu B nothing runs; a portable build (GGML_NATIVE=OFF) keeps one id on every CPU
    monkeypatch.setattr(_run, "run", fail_on_call)
    assert B.build_variant(rv, targets=["llama-bench"]).cached
    monkeypatch.setattr(_run, "run", fake)
    portable = make_rv(defines={"TOY_TILE": "64", "GGML_NATIVE": "OFF"})
    a = B.build_variant(portable, targets=["llama-bench"])
    monkeypatch.setattr(records, "host_isa", lambda: "x86_64-cpuA")
    monkeypatch.setattr(_run, "run", fail_on_call)
    b = B.build_variant(portable, targets=["llama-bench"])
    assert b.cached and b.build_id == a.build_id


def test_sigill_names_a_build_from_another_cpu() -> None:
    from tuner.targets.host import crash_hint, host_isa

    hint = crash_hint(-4, ["llama-bench", "-m", "x.gguf"])
    assert "SIGILL" in hint and "-march=native" in hint and "$TUNER_HOME/builds/" in hint
    assert crash_hint(1, ["llama-bench"]) == ""
    assert host_isa() == host_isa() and host_isa().startswith(os.uname().machine)
