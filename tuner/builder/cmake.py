"""Build stage: configure and compile one RenderedVariant into relocatable binaries.

Layout under ``$TUNER_HOME/builds/<rv.key>/`` (one directory per source + patch + defines)::

    src/                      private copy of the tree: hard links, real files for patched ones
    build/                    CMake (Ninja) build directory, shared by the key's candidates
    tu/<stem>.h               per-TU override headers force-included by the patch's CMake hook
    logs/                     configure.log, build-<artifact_key>.log
    artifacts/<artifact_key>  link to the current artifacts/<artifact_key>.v<N>/: bin/ (executables +
                              shared libraries), build.json; a build that changes it installs a new
                              folder, and old ones stay while a command runs from them (records.py)
    build.json                record of the latest attempt (ok or failed)

Every scikit-build-core import of tuner lives in this module (its CMake API is not documented as
stable; one place to fix on upgrade). Extra executables are built on demand into a finished build, without
touching its build id (:func:`ensure_targets`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import re
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet
from scikit_build_core.cmake import CMake, CMaker
from scikit_build_core.errors import CMakeConfigError, CMakeNotFoundError
from scikit_build_core.file_api.query import stateless_query
from scikit_build_core.program_search import best_program, get_ninja_programs

from tuner import _run, log, progress
from tuner._hash import file_sha256, stable_hash
from tuner.builder import hip
from tuner.builder.hip import HipToolchain
from tuner.builder.records import (
    adopt_old_layout,
    cached_record,
    current_artifact,
    hold_artifact,
    install_artifact,
    is_on,
    load_build_record,
    locked,
    native_isa,
    write_json,
)
from tuner.errors import TunerError, UsageError, close_matches
from tuner.paths import tuner_home
from tuner.plan import tu_split
from tuner.plan.variant import Build, RenderedVariant, variant_family

DEFAULT_TARGETS = ("llama-bench", "test-backend-ops", "llama-quantize")


def search_targets(cpu: bool) -> tuple[str, ...]:
    """What ``tuner search`` builds: llama-bench alone on the CPU backend (test-backend-ops' reference: no gate, no
    kernel screen; its default model is written quantized), a third less compiling on 2 cores; the default targets
    on a GPU. llama-perplexity is added when the output gate needs it (:func:`ensure_targets`)."""
    return ("llama-bench",) if cpu else DEFAULT_TARGETS


_CMAKE_SPEC = ">=3.28"
HIP_CMAKE_SPEC = ">=3.28,<4"
_NINJA_SPEC = ">=1.10"
_TARGET_RE = re.compile(r"^[A-Za-z0-9_.+-]{1,100}$")
_PROGRESS_RE = re.compile(r"^\[(\d+)/(\d+)\]")
_CUDA_DIR = Path("ggml/src/ggml-cuda")


@dataclasses.dataclass(frozen=True, kw_only=True)
class BuildTools:
    """CMake and Ninja picked for a build (scikit-build-core's search)."""

    cmake: CMake
    """CMake found by ``CMake.default_search`` (``$CMAKE_EXECUTABLE`` > PyPI wheel > PATH)."""
    ninja: Path


@functools.cache
def find_build_tools(cmake_executable: str | None = None, cmake_spec: str = _CMAKE_SPEC) -> BuildTools:
    """Find CMake (``cmake_executable``: the HIP toolchain's cmake<4, else a search) and Ninja.

    Raises TunerError saying what to install when none is found.
    """
    env = {**os.environ, **({"CMAKE_EXECUTABLE": cmake_executable} if cmake_executable else {})}
    try:
        cmake = CMake.default_search(version=SpecifierSet(cmake_spec), env=env)
    except CMakeNotFoundError as err:
        raise TunerError(f"{err}. Install it with `pip install 'cmake{cmake_spec}'` or set CMAKE_EXECUTABLE.") from err
    ninja = best_program(get_ninja_programs(), version=SpecifierSet(_NINJA_SPEC))
    if ninja is None:
        raise TunerError(f"No ninja{_NINJA_SPEC} found. Install it with `pip install ninja`.")
    return BuildTools(cmake=cmake, ninja=ninja.path)


def check_target_names(targets: Sequence[str]) -> None:
    """UsageError for a build target that is not a CMake target name (before anything runs)."""
    for t in targets:
        if not isinstance(t, str) or not _TARGET_RE.match(t):
            raise UsageError(f"Build target {t!r} is not a CMake target name (letters, digits, '_.+-').")


def _hip_targets(defines: Mapping[str, str]) -> list[str]:
    raw = defines.get("GPU_TARGETS") or defines.get("AMDGPU_TARGETS") or defines.get("CMAKE_HIP_ARCHITECTURES") or ""
    return [t for t in re.split(r"[;,\s]+", raw) if t]


def default_check_objects(rv: RenderedVariant) -> list[str]:
    """Translation units a ``--compile-only`` check compiles by default (paths relative to the tree).

    The selector TU ``fattn.cu``, one tile and one MMA instance (era ``mma``) or the tile and a VEC hs64 instance (era
    ``rocwmma``), plus every TU the variant's compile-time knobs give a header. Where the patch's CUDA hook splits the
    MMA instances per head size, the whole instance is not compiled, so its D64 split TU stands in for it.
    """
    base = [_CUDA_DIR / "fattn.cu"]
    inst = _CUDA_DIR / "template-instances"
    if rv.era == "rocwmma":
        base += [_CUDA_DIR / "fattn-tile-f16.cu", inst / "fattn-vec-f16-instance-hs64-f16-f16.cu"]
    else:
        mma = (inst / "fattn-mma-f16-instance-ncols1_16-ncols2_4.cu").as_posix()
        if tu_split.has_mma_split(rv.files, era=rv.era, family=variant_family(rv.variant)):
            mma = tu_split.split_tu(mma, 64)
        base += [inst / "fattn-tile-instance-dkq64-dv64.cu", Path(mma)]
    out = [p.as_posix() for p in base]
    out += [k for k, v in sorted(rv.tu_headers.items()) if v.strip() and k not in out]
    return out


def _resolve(prog: str | os.PathLike[str] | None) -> Path | None:
    if not prog:
        return None
    found = shutil.which(os.fspath(prog))
    return Path(found).resolve() if found else None


def _fingerprint(path: Path | None) -> list[str | int | None]:
    # Identity without running anything (a cache hit must not start a process), and by content rather
    # than path and mtime: each fresh venv (CI makes one per run) installs the same cmake/ninja wheel
    # under a new path with a new mtime, which must not invalidate every cached build.
    if path is None:
        return [None]
    try:
        st = path.stat()
    except OSError:
        return [str(path), None]
    return [path.name, st.st_size, _file_digest(str(path), st.st_size, st.st_mtime_ns)]


@functools.cache  # keyed by size and mtime too, so a replaced file is hashed again
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    return file_sha256(path)[:16]


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Toolchain:
    tools: BuildTools
    compilers: Mapping[str, Path | None]
    hip: HipToolchain | None
    host_isa: str | None = None
    """This CPU's :func:`tuner.targets.host.host_isa` for a ``GGML_NATIVE`` build (``-march=native``), else
    None: its objects are this CPU's code, so another CPU must not take them as built."""

    @property
    def programs(self) -> dict[str, str | os.PathLike[str] | None]:
        return {"cmake": self.tools.cmake.cmake_path, "ninja": self.tools.ninja, **self.compilers}

    @property
    def identity(self) -> list[list[object]]:
        out: list[list[object]] = [[k, _fingerprint(_resolve(v))] for k, v in sorted(self.programs.items())]
        if self.host_isa is not None:  # absent otherwise: the ids of portable builds stay as they were
            out.append(["host_isa", self.host_isa])
        return out


def _find_toolchain(rv: RenderedVariant) -> _Toolchain:
    d = rv.defines
    if is_on(d.get("GGML_HIP")):
        tc = hip.require_hip_toolchain()
        for t in _hip_targets(d):
            tc.require_arch(t)
        tools = find_build_tools(str(tc.cmake), HIP_CMAKE_SPEC)
        return _Toolchain(tools=tools, hip=tc, compilers={"cc": tc.clang, "cxx": tc.clangxx, "hip": tc.clangxx})
    tools = find_build_tools()
    compilers: dict[str, Path | None] = {
        "cc": _resolve(d.get("CMAKE_C_COMPILER") or os.environ.get("CC") or "cc"),
        "cxx": _resolve(d.get("CMAKE_CXX_COMPILER") or os.environ.get("CXX") or "c++"),
    }
    if is_on(d.get("GGML_CUDA")):
        nvcc = d.get("CMAKE_CUDA_COMPILER") or os.environ.get("CUDACXX") or shutil.which("nvcc")
        compilers["nvcc"] = _resolve(nvcc or "/usr/local/cuda/bin/nvcc")
    return _Toolchain(tools=tools, compilers=compilers, hip=None, host_isa=native_isa(d))


@functools.cache
def _version_line(path: str) -> str:
    res = _run.run([path, "--version"], check=False, timeout=60, what=f"{Path(path).name} --version")
    lines = [ln.strip() for ln in res.output.splitlines() if ln.strip()]
    release = [ln for ln in lines if "release" in ln.lower()]  # nvcc's first line names no version
    return (release or lines or ["unknown"])[0]


def _prepare_src(rv: RenderedVariant, dest: Path) -> None:
    """Private copy of the pristine tree with the variant's files, written atomically."""
    if (dest / ".tuner-src.json").exists():
        return
    pristine = Path(rv.source_root)
    if not (pristine / "CMakeLists.txt").is_file():
        raise TunerError(
            f"{pristine} is not a llama.cpp source tree (no CMakeLists.txt). Fetch it again with `tuner source fetch`."
        )
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)  # an interrupted copy is redone from scratch
    for dirpath, dirnames, filenames in os.walk(pristine):
        dirnames[:] = [n for n in dirnames if n != ".git"]
        rel = Path(dirpath).relative_to(pristine)
        (tmp / rel).mkdir(parents=True, exist_ok=True)
        for name in filenames:
            s = Path(dirpath) / name
            if s.is_symlink():
                os.symlink(os.readlink(s), tmp / rel / name)
                continue
            try:
                os.link(s, tmp / rel / name)
            except OSError:  # another filesystem, or links not allowed
                shutil.copy2(s, tmp / rel / name)
    for name, text in rv.files.items():
        target = tmp / name
        if not target.resolve().is_relative_to(tmp.resolve()):
            raise UsageError(f"Patched file path {name!r} leaves the source tree.")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)  # never write through a hard link into the pristine tree
        target.write_text(text)
    (tmp / ".tuner-src.json").write_text(json.dumps({"source_id": rv.source_id, "patch": stable_hash(rv.patch)}))
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)


def _has_tu_hook(rv: RenderedVariant) -> bool:
    return any("GGML_TUNER_TU_DIR" in text for text in rv.files.values())


def _write_tu_headers(rv: RenderedVariant, src: Path, tu_dir: Path) -> list[str]:
    """Write ``tu/<stem>.h`` for every TU the hook may include; return the headers that changed.

    A header is only rewritten when its text changes, so Ninja's depfile check rebuilds exactly the
    TUs whose override changed. The per-head-size MMA TUs that the CUDA hook generates at configure
    (:func:`tuner.plan.tu_split.split_tus`) count as files of the tree before they exist.
    """
    splits = set(tu_split.split_tus(src))
    for rel in rv.tu_headers:
        if not (src / rel).is_file() and rel not in splits:
            raise UsageError(f"tu_headers names {rel!r}, which is not a file of the source tree {rv.source_root}.")
    known = {p.relative_to(src).as_posix() for p in (src / _CUDA_DIR).rglob("*.cu")} | splits | set(rv.tu_headers)
    tu_dir.mkdir(parents=True, exist_ok=True)
    changed = []
    for rel in sorted(known):
        header = tu_dir / f"{Path(rel).stem}.h"
        text = rv.tu_headers.get(rel, "")
        with contextlib.suppress(OSError):
            if header.read_text() == text:
                continue
        tmp = header.with_suffix(".h.tmp")
        tmp.write_text(text)
        tmp.replace(header)
        changed.append(rel)
    return changed


def parse_ninja_progress(line: str) -> tuple[int, int] | None:
    """``(done, total)`` from a Ninja status line such as ``[57/145] Building CXX object ...``."""
    m = _PROGRESS_RE.match(line)
    return (int(m.group(1)), int(m.group(2))) if m else None


def parse_ninja_log(text: str) -> list[tuple[str, str]]:
    """Entries of a ``.ninja_log`` (v5..v7): ``(output, full line)`` pairs, header skipped."""
    rows = [(line.split("\t"), line) for line in text.splitlines() if line and not line.startswith("#")]
    return [(parts[3], line) for parts, line in rows if len(parts) >= 5]


def _ninja_entries(build_dir: Path) -> list[tuple[str, str]]:
    try:
        return parse_ninja_log((build_dir / ".ninja_log").read_text(errors="replace"))
    except OSError:
        return []


def ninja_log_lines(build_dir: Path) -> set[str]:
    """The lines of the build's ``.ninja_log`` (a snapshot before a build, for :func:`rebuilt_objects`)."""
    return {ln for _, ln in _ninja_entries(build_dir)}


def rebuilt_objects(build_dir: Path, before: set[str]) -> list[str]:
    """Object files the build wrote since the ``before`` snapshot of :func:`ninja_log_lines`."""
    # New lines since the snapshot = outputs built by this run. A set difference (rather than a byte
    # offset or timestamps) survives Ninja recompacting the log.
    return sorted({o for o, ln in _ninja_entries(build_dir) if ln not in before and o.endswith((".o", ".obj"))})


class _Progress:
    """Feeds Ninja's ``[n/N]`` status lines into a :func:`tuner.progress.track` bar (count and ETA)."""

    def __init__(self, tracker: progress.Tracker) -> None:
        self.tracker = tracker

    def __call__(self, line: str) -> None:
        got = parse_ninja_progress(line)
        if got is not None:
            self.tracker.update(got[0], total=got[1])


def _configure(
    rv: RenderedVariant, tc: _Toolchain, src: Path, build_dir: Path, tu_dir: Path, logs: Path, *, compile_only: bool
) -> dict[str, str]:
    defines: dict[str, str | os.PathLike[str] | bool] = {**(tc.hip.defines() if tc.hip else {}), **rv.defines}
    defines.setdefault("CMAKE_BUILD_RPATH_USE_ORIGIN", "ON")  # artifacts must run from any directory
    # A compile-time trial changes FA TUs of libggml-cuda only: without this, Ninja relinks every library
    # and executable that links it (libggml, libllama, libllama-common, the tools); with it, only the library
    # whose objects changed. The tools load the new one by soname, and a trial changes no exported symbol.
    # A configure define, not one of rv.defines: build ids stay as they are.
    defines.setdefault("CMAKE_LINK_DEPENDS_NO_SHARED", "ON")
    defines["CMAKE_EXPORT_COMPILE_COMMANDS"] = "ON"  # compile-only finds object targets here
    defines["CMAKE_MAKE_PROGRAM"] = tc.tools.ninja
    if rv.tu_headers or _has_tu_hook(rv):
        # Passed even for candidates without overrides (empty headers): identical compile flags for
        # every candidate of a key, so switching candidates rebuilds only TUs whose header changed.
        defines["GGML_TUNER_TU_DIR"] = tu_dir
    ggml_cmake = src / "ggml" / "CMakeLists.txt"
    if ggml_cmake.is_file() and "GGML_CCACHE" in ggml_cmake.read_text(errors="replace"):
        defines["GGML_CCACHE"] = "ON" if shutil.which("ccache") else "OFF"  # OFF: no "not found" warning
    notes: dict[str, str] = {}
    if compile_only and tc.hip is not None and is_on(str(defines.get("GGML_HIP_ROCWMMA_FATTN"))):
        if not (tc.hip.rocm_path / "include" / "rocwmma" / "rocwmma.hpp").is_file():
            msg = (
                "rocWMMA headers are not available from any package registry reachable here (Debian "
                "experimental's librocwmma-dev lacks rocwmma/internal/*), so fattn-wmma-f16.cu cannot be "
                "compile-checked; checking the non-rocWMMA TUs with GGML_HIP_ROCWMMA_FATTN=OFF instead."
            )
            log.warning(msg)
            notes["rocwmma"] = msg
            defines["GGML_HIP_ROCWMMA_FATTN"] = "OFF"

    stamp_file = build_dir / ".tuner-configure.json"
    stamp = {"defines": {k: str(v) for k, v in defines.items()}, "toolchain": tc.identity}
    old = load_build_record(stamp_file)
    if old == stamp and (build_dir / "build.ninja").is_file():
        return notes
    isa = [
        e[1] for e in (old or {}).get("toolchain") or [] if isinstance(e, list) and len(e) == 2 and e[0] == "host_isa"
    ]
    if old and next(iter(isa), None) != tc.host_isa:  # the old stamp's host_isa (None: a portable build)
        # Another CPU's -march=native objects: their compile commands are the same text, so Ninja would
        # keep them. Only a new build folder recompiles them.
        shutil.rmtree(build_dir, ignore_errors=True)
        build_dir.mkdir(parents=True)
        old = None
    try:
        # CMaker validates the dirs, writes the file-API query and wipes a stale cache (source dir or
        # skbc install moved; fresh=True when the toolchain changed under an existing cache).
        cmaker = CMaker(
            tc.tools.cmake,
            source_dir=src,
            build_dir=build_dir,
            build_type="Release",
            fresh=bool(old and old.get("toolchain") != tc.identity),
        )
    except CMakeConfigError as err:
        raise TunerError(f"{err}. Remove {build_dir.parent} and rerun.") from err
    stateless_query(build_dir)
    # CMaker.configure() runs cmake through skbc's Run.live(), which inherits our stdout and cannot
    # write a log file. We need configure output in logs/configure.log (and its tail in errors), so
    # we run the same command line (CMaker's -D encoding) through tuner._run instead.
    args = [f"-S{src}", f"-B{build_dir}", f"-DCMAKE_BUILD_TYPE:STRING={cmaker.build_type}"]
    for key, value in defines.items():
        if isinstance(value, bool):
            args.append(f"-D{key}:BOOL={'ON' if value else 'OFF'}")
        elif isinstance(value, os.PathLike):
            args.append(f"-D{key}:PATH={os.fspath(value)}")
        else:
            args.append(f"-D{key}={value}")
    env = tc.hip.env(cmaker.env) if tc.hip is not None else cmaker.env
    log_file = logs / "configure.log"
    log_file.unlink(missing_ok=True)
    stamp_file.unlink(missing_ok=True)
    argv: list[str | os.PathLike[str]] = [tc.tools.cmake.cmake_path, *args, "-GNinja"]
    _run.run(argv, env=env, log_file=log_file, timeout=900, what=f"CMake configure of {rv.short}")
    write_json(stamp_file, stamp)
    return notes


def _object_targets(build_dir: Path, src: Path, objects: Sequence[str]) -> list[str]:
    try:
        entries = json.loads((build_dir / "compile_commands.json").read_text())
    except (OSError, ValueError) as err:
        raise TunerError(f"{build_dir}/compile_commands.json is missing or unreadable; rerun the build.") from err
    by_file: dict[str, str] = {}
    for e in entries:
        f = Path(e["directory"], e["file"])
        with contextlib.suppress(ValueError):
            rel = os.path.relpath(os.path.normpath(f), src)
            out = e.get("output") or ""
            by_file[Path(rel).as_posix()] = os.path.relpath(os.path.normpath(Path(e["directory"], out)), build_dir)
    for obj in objects:
        if obj not in by_file:
            raise UsageError(
                f"{obj!r} is not compiled by this configuration (not in {build_dir}/compile_commands.json)."
                f"{close_matches(obj, by_file)} Pass a .cu/.cpp path relative to the llama.cpp tree."
            )
    return [by_file[obj] for obj in objects]


def _copy_artifacts(build_dir: Path, art: Path, targets: Sequence[str], record: Mapping[str, object]) -> Path:
    """Copy the targets' executables and all shared libraries into a new folder and make it the artifact's
    current one (:func:`tuner.builder.records.install_artifact`); returns that folder."""
    bin_src = build_dir / "bin"
    for stale in art.parent.glob(art.name + ".partial-*"):  # left by a killed build; we hold the lock
        shutil.rmtree(stale, ignore_errors=True)
    tmp = art.with_name(art.name + f".partial-{os.getpid()}")
    (tmp / "bin").mkdir(parents=True)
    for t in targets:
        exe = bin_src / t
        if not exe.is_file():
            shutil.rmtree(tmp, ignore_errors=True)
            raise TunerError(f"The build finished but {exe} does not exist; is {t!r} an executable target?")
        shutil.copy2(exe, tmp / "bin" / t)
    for lib in sorted(bin_src.glob("lib*.so*")):
        if lib.is_symlink():
            os.symlink(os.readlink(lib), tmp / "bin" / lib.name)
        else:
            shutil.copy2(lib, tmp / "bin" / lib.name)
    write_json(tmp / "build.json", record)
    # Never over the folder in use: a running search keeps the binaries it holds (records' docstring).
    return install_artifact(tmp, art)


def _with_earlier_targets(art: Path, targets: Sequence[str]) -> list[str]:
    """``targets`` and those the artifact's current folder already has (its own and extra ones), so a
    build that adds one tool installs a folder that still has the others."""
    cur = current_artifact(art)
    rec = load_build_record(cur / "build.json") if cur is not None else None
    if not rec or rec.get("status") != "ok":
        return list(targets)
    earlier = [*rec.get("targets", []), *rec.get("extra_targets", {})]
    return [*targets, *(t for t in earlier if isinstance(t, str) and t not in targets)]


def _check_offload(build_dir: Path, obj_targets: Sequence[str], archs: Sequence[str]) -> dict[str, list[str]]:
    """gfx targets in each object's offload bundle; fail unless the requested ones are really there.

    A TU without any ``__global__`` kernel (tree B's ``fattn.cu`` is host dispatch only) gets no bundle
    at all; that is recorded as ``[]``. An object *with* a bundle that lacks a requested target, or
    no object holding any code for it, is an error.
    """
    found: dict[str, list[str]] = {}
    for t in obj_targets:
        path = build_dir / t
        data = path.read_bytes()
        got = hip.parse_offload_targets(data)
        has_bundle = b"__CLANG_OFFLOAD_BUNDLE__" in data
        missing = [a for a in archs if a not in got]
        if has_bundle and missing:
            raise TunerError(
                f"{path} compiled, but its HIP offload bundle has no code object for {', '.join(missing)} "
                f"(found: {', '.join(got) or 'none'}). The HIP flags did not reach this TU; check "
                "GPU_TARGETS and the configure log."
            )
        found[t] = got
    for a in archs:
        if not any(a in got for got in found.values()):
            raise TunerError(
                f"None of the compiled objects ({', '.join(Path(t).name for t in obj_targets)}) holds a {a} "
                f"code object, so nothing was really compiled for {a}. Add a TU with device code "
                "(e.g. a fattn-tile or fattn-vec instance) or check GPU_TARGETS in the configure log."
            )
    return found


def _check_build_args(
    rv: RenderedVariant, targets: Sequence[str], jobs: int | None, compile_only: bool, objects: Sequence[str] | None
) -> tuple[list[str], int, list[str]]:
    targets = list(targets)
    check_target_names(targets)
    if not targets and not compile_only:
        raise UsageError("No build targets given. Name at least one, e.g. llama-bench.")
    jobs = (os.cpu_count() or 1) if jobs is None else jobs
    if not isinstance(jobs, int) or isinstance(jobs, bool) or not 1 <= jobs <= 1024:
        raise UsageError(f"--jobs must be an integer from 1 to 1024, not {jobs!r}.")
    if objects is not None and not compile_only:
        raise UsageError("objects= only applies to compile_only=True builds.")
    objs = list(objects) if objects is not None else (default_check_objects(rv) if compile_only else [])
    for o in objs:
        if not isinstance(o, str) or o.startswith("/") or ".." in Path(o).parts:
            raise UsageError(f"Object source {o!r} must be a path relative to the llama.cpp tree.")
    return targets, jobs, objs


def _new_record(rv: RenderedVariant, build_id: str, **attempt: object) -> dict[str, Any]:
    """The ``build.json`` record of an attempt (``attempt``: targets, objects, compile_only, jobs, log), before
    anything runs."""
    return {
        "build_id": build_id,
        **{k: getattr(rv, k) for k in ("key", "artifact_key", "arch", "variant", "era", "source_id")},
        "defines": dict(rv.defines),
        "patch_hash": stable_hash(rv.patch),
        "compile_values": dict(rv.compile_values),
        "tu_headers": sorted(k for k, v in rv.tu_headers.items() if v),
        **attempt,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _compile(rv: RenderedVariant, tc: _Toolchain, record: dict[str, Any], build_dir: Path, src: Path) -> list[str]:
    """Run the Ninja build of the record's targets (or its objects' targets) with its jobs and log; returns the
    rebuilt translation units."""
    targets, objs, compile_only, jobs = record["targets"], record["objects"], record["compile_only"], record["jobs"]
    log_file = Path(record["log"])
    before = ninja_log_lines(build_dir)
    log_file.unlink(missing_ok=True)
    build_targets = _object_targets(build_dir, src, objs) if compile_only else targets
    if compile_only and not build_targets:
        raise UsageError("compile_only=True needs at least one object to compile.")
    with progress.track(f"building {rv.short}", unit="steps") as bar:
        _run.run(
            [tc.tools.cmake.cmake_path, "--build", build_dir, "--target", *build_targets, "--parallel", str(jobs)],
            env=tc.hip.env() if tc.hip else None,
            log_file=log_file,
            on_line=_Progress(bar),
            what=f"Build of {rv.short} ({rv.variant} for {rv.arch})",
        )
    rebuilt = rebuilt_objects(build_dir, before)
    record.update(rebuilt_tus=rebuilt, rebuilt_count=len(rebuilt))
    if compile_only and tc.hip is not None:
        record["offload_targets"] = _check_offload(build_dir, build_targets, _hip_targets(rv.defines))
    return rebuilt


def is_built(rv: RenderedVariant, targets: Sequence[str] = DEFAULT_TARGETS) -> bool:
    """Whether :func:`build_variant` of ``rv`` would find its artifact built (and start no compile): a time
    budget prices only a build that runs. Reads the current artifact's record; holds and changes nothing."""
    tc = _find_toolchain(rv)
    art = tuner_home() / "builds" / rv.key / "artifacts" / rv.artifact_key
    cur = current_artifact(art)
    build_id = stable_hash(rv.artifact_key, tc.identity)
    return cur is not None and cached_record(cur, build_id, targets) is not None  # cur is art: the older layout


def build_variant(
    rv: RenderedVariant,
    *,
    targets: Sequence[str] = DEFAULT_TARGETS,
    jobs: int | None = None,
    compile_only: bool = False,
    objects: Sequence[str] | None = None,
) -> Build:
    """Configure and build one variant candidate (``jobs``: default the CPU count); reuse finished artifacts.

    ``targets`` are built and copied into the artifact's ``bin/``. ``compile_only``: configure, then compile only
    ``objects`` (paths relative to the tree, default :func:`default_check_objects`), no link, no artifacts; for HIP the
    objects' offload bundles must hold code for every GPU target. The Build's ``cached`` is True when the artifact
    already existed for this toolchain (no process is started then) or, for compile-only, when Ninja had nothing to do.

    Raises UsageError for bad targets, jobs or objects; TunerError when configure or compile failed (naming
    the variant, the log and its last lines), also recorded in ``build.json``.
    """
    start = time.monotonic()
    targets, jobs, objs = _check_build_args(rv, targets, jobs, compile_only, objects)
    tc = _find_toolchain(rv)
    build_id = stable_hash(rv.artifact_key, tc.identity)
    root = tuner_home() / "builds" / rv.key
    art = root / "artifacts" / rv.artifact_key
    build_dir, logs, src, tu_dir = root / "build", root / "logs", root / "src", root / "tu"

    def _done(rec: Mapping[str, Any], cached: bool, folder: Path, compile_only: bool = False) -> Build:
        return Build(
            build_id=build_id,
            build_dir=build_dir,
            bin_dir=folder / "bin",  # the folder this process holds, not the link another build may move
            log_file=Path(rec.get("log", logs / "build.log")),
            cached=cached,
            seconds=time.monotonic() - start,
            compile_only=compile_only,
            meta=dict(rec),
        )

    def _cached() -> tuple[Path, dict[str, Any]] | None:
        return hold_artifact(art, lambda folder: cached_record(folder, build_id, targets))

    if not compile_only and (got := _cached()):
        return _done(got[1], True, got[0])

    with locked(root):
        if not compile_only:
            adopt_old_layout(art)
            if got := _cached():  # another worker built it
                return _done(got[1], True, got[0])
            targets = _with_earlier_targets(art, targets)
        log_file = logs / (f"check-{rv.artifact_key}.log" if compile_only else f"build-{rv.artifact_key}.log")
        record = _new_record(
            rv, build_id, targets=targets, objects=objs, compile_only=compile_only, jobs=jobs, log=str(log_file)
        )
        rebuilt: list[str] = []
        try:
            _prepare_src(rv, src)  # a private source copy, then the per-TU headers
            changed = _write_tu_headers(rv, src, tu_dir) if (rv.tu_headers or _has_tu_hook(rv)) else []
            if any(v.strip() for v in rv.tu_headers.values()) and not _has_tu_hook(rv):
                raise UsageError(
                    f"{rv.short} has per-TU override headers but its patch has no GGML_TUNER_TU_DIR CMake hook, so "
                    "they would be silently ignored. Render the variant with the tile/MMA hook patch."
                )
            programs = sorted(tc.programs.items())
            record["toolchain"] = {k: (_version_line(str(v)) if v else "not found") for k, v in programs}
            record["headers_changed"] = changed
            logs.mkdir(parents=True, exist_ok=True)
            record["notes"] = _configure(rv, tc, src, build_dir, tu_dir, logs, compile_only=compile_only)
            rebuilt = _compile(rv, tc, record, build_dir, src)
            record["seconds"] = round(time.monotonic() - start, 3)
            record["status"] = "ok"
            if not compile_only:
                folder = _copy_artifacts(build_dir, art, targets, record)
        except TunerError as err:  # the failed attempt goes to build.json; a UsageError is raised as is
            record.update(status="failed", error=str(err), seconds=round(time.monotonic() - start, 3))
            if root.is_dir():
                write_json(root / "build.json", record)
            if isinstance(err, UsageError):
                raise
            raise TunerError(str(err) if rv.short in str(err) else f"Build of {rv.short} failed: {err}") from err
        write_json(root / "build.json", record)
    if compile_only:
        return _done(record, not rebuilt, build_dir, compile_only=True)
    held = hold_artifact(art, lambda d: d)
    return _done(record, False, held[0] if held else folder)


def ensure_targets(build: Build, targets: Sequence[str], *, jobs: int | None = None) -> Build:
    """Add executable targets (``llama-perplexity``) to a finished build's artifact, keeping its build id.

    Build ids (``stable_hash(artifact_key, toolchain)``) do not depend on the targets, and stored results and study
    databases key on them, so an extra tool is built on demand into the existing build directory (its own translation
    units plus a link) and copied into the artifact's ``bin/`` with the libraries it needs that are not there yet; the
    candidate's own libraries are never replaced. ``build.json`` records each extra target under ``extra_targets``
    (seconds, log, rebuilt objects); ``targets`` and ``build_id`` are unchanged, so :func:`build_variant` still finds
    the artifact cached. Returns the Build with ``meta`` updated (the same object when every target was there).

    Raises UsageError for a compile-only build or a bad target name, TunerError (naming the log and its last
    lines) when a target fails to build.
    """
    if build.compile_only:
        raise UsageError(f"{build.build_dir} is a compile-only check; build the variant first (`tuner build`).")
    check_target_names(targets)
    jobs = jobs or os.cpu_count() or 1
    art = Path(build.bin_dir).parent
    if all((art / "bin" / t).is_file() for t in targets):
        return build
    root = Path(build.build_dir).parent
    with locked(root):
        art = _current(art, build.build_id)
        missing = [t for t in targets if not (art / "bin" / t).is_file()]
        rec = load_build_record(art / "build.json") or dict(build.meta)
        if missing and rec.get("carried"):
            # a carried build has no build directory here to add a target to
            raise UsageError(
                f"The build in {art} was carried from another machine (`tuner build --from-pack`) and has no "
                f"{', '.join(missing)}. On the machine that built it, pack it again with those targets "
                f"(`tuner build ... --targets {','.join([*rec.get('targets', []), *missing])} --pack FILE`), or build "
                "here without --from-pack."
            )
        if missing:
            defines = dict(rec.get("defines", {}))
            if is_on(defines.get("GGML_HIP")):
                tc_hip = hip.require_hip_toolchain()
                tools, env = find_build_tools(str(tc_hip.cmake), HIP_CMAKE_SPEC), tc_hip.env()
            else:
                tools, env = find_build_tools(), None
            log_file = root / "logs" / f"extra-{art.name}.log"
            start = time.monotonic()
            before = ninja_log_lines(build.build_dir)
            with log.step(f"Building {', '.join(missing)} into {art}"):
                _run.run(
                    [tools.cmake.cmake_path, "--build", build.build_dir, "--target", *missing, "--parallel", str(jobs)],
                    env=env,
                    log_file=log_file,
                    what=f"Build of {', '.join(missing)} in {build.build_dir}",
                )
            rebuilt = rebuilt_objects(build.build_dir, before)
            bin_src = Path(build.build_dir) / "bin"
            for t in missing:
                if not (bin_src / t).is_file():
                    msg = f"The build finished but {bin_src / t} does not exist; is {t!r} an executable target?"
                    raise TunerError(msg)
            # New libraries only (the tool's own, e.g. libllama-perplexity-impl.so); the artifact's
            # existing libraries are the candidate's and stay as they are.
            for lib in sorted(bin_src.glob("lib*.so*")):
                dst = art / "bin" / lib.name
                if dst.exists() or dst.is_symlink():
                    continue
                if lib.is_symlink():
                    os.symlink(os.readlink(lib), dst)
                else:
                    shutil.copy2(lib, dst)
            for t in missing:
                tmp = art / "bin" / f".{t}.partial-{os.getpid()}"
                shutil.copy2(bin_src / t, tmp)
                tmp.rename(art / "bin" / t)
            secs, built = round(time.monotonic() - start, 3), time.strftime("%Y-%m-%dT%H:%M:%S%z")
            entry = {"seconds": secs, "log": str(log_file), "rebuilt": rebuilt, "built": built}
            rec["extra_targets"] = {**rec.get("extra_targets", {}), **{t: dict(entry) for t in missing}}
            write_json(art / "build.json", rec)
    return dataclasses.replace(build, bin_dir=art / "bin", meta=dict(rec))


def _current(folder: Path, build_id: str) -> Path:
    """The artifact's current folder where a later build of the same id installed one after ``folder`` (another
    command added a target meanwhile, records.py): the extra target goes there, or the next cached lookup
    would not see it. ``folder`` itself otherwise (an older layout, or another build id)."""
    link = folder.parent / re.sub(r"\.v\d+$", "", folder.name)
    got = hold_artifact(
        link, lambda f: f if (load_build_record(f / "build.json") or {}).get("build_id") == build_id else None
    )
    return got[0] if got is not None else folder
