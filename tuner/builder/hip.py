"""The AMD HIP compile-check toolchain: clang-19 plus Debian's ROCm 6.4 headers, no AMD GPU needed.

Nothing built with it can run; it exists so a HIP variant's patched FlashAttention translation units are compiled for
the real target (gfx1151, gfx1100, gfx1201, gfx942) on a machine without ROCm. The recipe:

1. ``clang-19 lld-19 clang-tools-19 libclang-rt-19-dev`` from Debian bookworm (``apt-get install``, root).
2. HIP/hipBLAS/rocBLAS ``-dev`` packages from sid and ``rocm-device-libs-17`` from trixie, fetched with a
   *private* APT configuration (the system's ``/etc/apt`` is never touched) and unpacked with
   ``dpkg-deb -x`` into ``PREFIX/root``.
3. An empty ``librocblas.so.4.4`` stub (the real one is 4 GB; the CMake targets only check it exists)
   and the ``usr/bin`` directory ``hip-config.cmake`` insists on.
4. ``cmake>=3.28,<4`` from PyPI in ``PREFIX/venv`` (bookworm's 3.25 cannot find Debian's hip-lang).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from tuner import _run, log
from tuner.errors import TunerError, UsageError
from tuner.paths import tuner_home

HIP_ARCHS = ("gfx1151", "gfx1100", "gfx1201", "gfx942")
"""Targets the compile-check is meant for (RDNA3.5, RDNA3, RDNA4, CDNA3)."""

_RECIPE = 1
"""Bumped when the recipe changes, so an old prefix is set up again."""

_LLVM = Path("/usr/lib/llvm-19")
_SYSTEM_PACKAGES = ("clang-19", "lld-19", "clang-tools-19", "libclang-rt-19-dev", "ninja-build")
# Pinned sid versions that were tested; sid is rolling, so an unpinned retry takes what sid has now.
_DEB_PACKAGES = (
    "libamdhip64-dev=6.4.3-5",
    "libamdhip64-6=6.4.3-5",
    "libhiprtc-builtins6=6.4.3-5",
    "libhiprtc6=6.4.3-5",
    "libamd-comgr-dev=7.0.2+dfsg-3",
    "libamd-comgr3=7.0.2+dfsg-3",
    "libhsa-runtime-dev=6.4.3+dfsg-5",
    "libhsa-runtime64-1=6.4.3+dfsg-5",
    "libhipblas-dev=6.4.4-1",
    "libhipblas2=6.4.4-1",
    "libhipblas-common-dev",
    "librocblas-dev=6.4.4-4",
    "rocm-device-libs-17",
)
_MIRROR = "http://deb.debian.org/debian"
_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
_CMAKE_SPEC = "cmake>=3.28,<4"
_ARCH_RE = re.compile(r"^gfx[0-9]{3,4}[a-z]?$")


def default_prefix() -> Path:
    """``$TUNER_HOME/toolchains/hip``."""
    return tuner_home() / "toolchains" / "hip"


@dataclasses.dataclass(frozen=True, kw_only=True)
class HipToolchain:
    """A set-up HIP compile-check toolchain (see the module docstring)."""

    prefix: Path
    """Where the unpacked debs (``root/``), the cmake venv (``venv/``) and ``env.sh`` live."""
    rocm_path: Path
    """``PREFIX/root/usr``: HIP headers, CMake configs and libraries (what ``ROCM_PATH`` points at)."""
    clang: Path
    clangxx: Path
    """clang-19 C++ and HIP compiler."""
    cmake: Path
    """CMake 3.28..3.x from the private venv; use it instead of the default CMake for HIP trees."""
    device_lib_path: Path
    """ocml/ockl/oclc bitcode of rocm-device-libs-17."""
    hip_version: str
    """HIP version of the unpacked headers, e.g. ``6.4.43484``."""
    device_archs: tuple[str, ...]
    """gfx targets whose ``oclc_isa_version_*.bc`` exists, i.e. that can be compiled."""

    @property
    def compile_flags(self) -> str:
        """Flags every HIP compile needs: where HIP and the device libraries are."""
        return f"--rocm-path={self.rocm_path} --rocm-device-lib-path={self.device_lib_path}"

    def defines(self) -> dict[str, str]:
        """CMake cache entries that select this toolchain for a ``GGML_HIP=ON`` configure."""
        libdir = self.rocm_path / "lib" / "x86_64-linux-gnu"
        # -L: CMake's compiler-ID link needs libamdhip64; --allow-shlib-undefined: sid's .so files
        # reference newer glibc/hsa symbols. The result links but cannot run, which is fine here.
        flags = f"{self.compile_flags} -L{libdir} -Wl,--allow-shlib-undefined"
        return {
            "CMAKE_HIP_COMPILER": str(self.clangxx),
            "CMAKE_C_COMPILER": str(self.clang),
            "CMAKE_CXX_COMPILER": str(self.clangxx),
            "CMAKE_HIP_FLAGS": flags,
            "CMAKE_PREFIX_PATH": str(self.rocm_path),
        }

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """A child environment with ``ROCM_PATH`` set and clang-19's tools first on PATH.

        clang prints "Found HIP installation" from ``ROCM_PATH``, which CMake parses; ggml-hip's CMakeLists reads it
        too. ``HIP_PLATFORM=amd`` keeps HIP headers off the nvcc path on machines with a CUDA toolkit.
        """
        env = dict(os.environ if base is None else base)
        env.update(ROCM_PATH=str(self.rocm_path), HIP_PATH=str(self.rocm_path), HIP_PLATFORM="amd")
        env["PATH"] = os.pathsep.join([str(self.clang.parent), env.get("PATH", "")])
        return env

    def require_arch(self, arch: str) -> None:
        """Raise UsageError when ``arch`` has no device library in this toolchain."""
        if arch not in self.device_archs:
            raise UsageError(
                f"The HIP compile-check toolchain in {self.prefix} has no device library for {arch} "
                f"(no oclc_isa_version_{arch[3:]}.bc in {self.device_lib_path}), so clang cannot "
                f"compile for it. Compilable targets here: {', '.join(self.device_archs) or 'none'}."
            )


def _clang_ok() -> bool:
    # clang-offload-bundler (clang-tools-19): clang needs it on its program path
    needed = [_LLVM / "bin" / name for name in ("clang", "clang++", "clang-offload-bundler", "ld.lld")]
    rt = list((_LLVM / "lib" / "clang").glob("19*/lib/linux/libclang_rt.builtins-x86_64.a"))
    return all(p.exists() for p in needed) and bool(rt)


def _hip_version(rocm: Path) -> str:
    hdr = rocm / "include" / "hip" / "hip_version.h"
    try:
        text = hdr.read_text()
    except OSError:
        return "unknown"
    parts = [re.search(rf"#define HIP_VERSION_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) for m in parts if m) or "unknown"


def _toolchain_from(prefix: Path) -> HipToolchain:
    rocm = prefix / "root" / "usr"
    bitcode = rocm / "lib" / "llvm-17" / "lib" / "clang" / "17" / "amdgcn" / "bitcode"
    return HipToolchain(
        prefix=prefix,
        rocm_path=rocm,
        clang=_LLVM / "bin" / "clang",
        clangxx=_LLVM / "bin" / "clang++",
        cmake=prefix / "venv" / "bin" / "cmake",
        device_lib_path=bitcode,
        hip_version=_hip_version(rocm),
        device_archs=tuple(a for a in HIP_ARCHS if (bitcode / f"oclc_isa_version_{a[3:]}.bc").is_file()),
    )


def find_hip_toolchain(prefix: Path | None = None) -> HipToolchain | None:
    """The toolchain :func:`run_hip_setup` set up in ``prefix`` (default :func:`default_prefix`).

    None when the prefix was never (or only partly) set up, or clang-19 is gone.
    """
    prefix = Path(prefix) if prefix is not None else default_prefix()
    try:
        stamp = json.loads((prefix / "toolchain.json").read_text())
    except (OSError, ValueError):
        return None
    if stamp.get("recipe") != _RECIPE or not _clang_ok():
        return None
    tc = _toolchain_from(prefix)
    needed = [
        tc.cmake,
        tc.rocm_path / "include" / "hip" / "hip_runtime.h",
        tc.rocm_path / "lib" / "x86_64-linux-gnu" / "librocblas.so.4.4",
        tc.rocm_path / "bin",
    ]
    return tc if all(p.exists() for p in needed) and tc.device_archs else None


def require_hip_toolchain(prefix: Path | None = None) -> HipToolchain:
    """Like :func:`find_hip_toolchain`, but a missing toolchain is a TunerError saying how to get it."""
    tc = find_hip_toolchain(prefix)
    if tc is None:
        where = prefix if prefix is not None else default_prefix()
        opt = f" --prefix {where}" if prefix is not None else ""
        raise TunerError(
            f"No HIP compile-check toolchain in {where}. HIP variants are compiled with clang-19 and "
            f"Debian's ROCm 6.4 headers; set them up once with `tuner toolchain hip{opt}` (needs root "
            "for apt-get, about a minute and 600 MB), then rerun."
        )
    return tc


def _write_apt_config(apt: Path) -> Path:
    for d in ("state/lists/partial", "cache/archives/partial", "sources.list.d", "preferences.d"):
        (apt / d).mkdir(parents=True, exist_ok=True)
    (apt / "state" / "status").touch()
    (apt / "sources.list").write_text(
        "".join(f"deb [signed-by={_KEYRING}] {_MIRROR} {suite} main\n" for suite in ("trixie", "sid"))
    )
    lines = [
        f'Dir::State "{apt / "state"}";',
        f'Dir::State::status "{apt / "state" / "status"}";',
        f'Dir::Cache "{apt / "cache"}";',
        f'Dir::Etc::SourceList "{apt / "sources.list"}";',
        f'Dir::Etc::SourceParts "{apt / "sources.list.d"}";',
        f'Dir::Etc::PreferencesParts "{apt / "preferences.d"}";',
        'APT::Architecture "amd64";',
        # This mirror's sid Release files were seen expired; we only unpack headers from them.
        'Acquire::Check-Valid-Until "false";',
        'Acquire::Languages "none";',
    ]
    if os.geteuid() == 0:
        lines.append('APT::Sandbox::User "root";')  # _apt cannot write into root's home
    conf = apt / "apt.conf"
    conf.write_text("\n".join(lines) + "\n")
    return conf


def _install_clang(logs: Path) -> None:
    if _clang_ok():
        return
    cmd = "apt-get install -y --no-install-recommends " + " ".join(_SYSTEM_PACKAGES)
    advice = (
        f"Run `sudo apt-get update && sudo {cmd}` (Debian 12 bookworm main has clang 19.1.7), then "
        "rerun `tuner toolchain hip`."
    )
    if os.geteuid() != 0:
        msg = f"The HIP toolchain needs clang-19 from Debian's own archive, and installing it needs root. {advice}"
        raise TunerError(msg)
    if shutil.which("apt-get") is None:
        raise TunerError(f"apt-get was not found; this recipe needs Debian 12 (bookworm). {advice}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        _run.run(["apt-get", "update"], env=env, log_file=logs / "apt-system.log", timeout=600, what="apt-get update")
        argv = ["apt-get", "install", "-y", "--no-install-recommends", *_SYSTEM_PACKAGES]
        _run.run(argv, env=env, log_file=logs / "apt-system.log", timeout=900, what="apt-get install clang-19")
    except TunerError as err:
        raise TunerError(f"Installing clang-19 failed ({err}). {advice}") from err
    if not _clang_ok():
        msg = f"apt-get finished but {_LLVM}/bin/clang, clang-offload-bundler or ld.lld is missing. {advice}"
        raise TunerError(msg)


def _download_debs(prefix: Path, logs: Path) -> list[Path]:
    debs = prefix / "debs"
    done = debs / ".complete"
    if done.exists():
        return sorted(debs.glob("*.deb"))
    conf = _write_apt_config(prefix / "apt")
    env = {**os.environ, "APT_CONFIG": str(conf)}
    log_file = logs / "apt-private.log"

    def apt_get(args: Sequence[str], what: str, cwd: Path | None = None) -> None:
        _run.run(["apt-get", *args], env=env, cwd=cwd, log_file=log_file, timeout=600, what=f"apt-get {what}")

    apt_get(["update"], "update (private trixie+sid config)")
    shutil.rmtree(debs, ignore_errors=True)
    debs.mkdir(parents=True)
    try:
        apt_get(["download", *_DEB_PACKAGES], "download (pinned ROCm 6.4 debs)", debs)
    except TunerError:
        # sid drops superseded versions from its pool; the research found newer ROCm headers work too.
        names = [p.split("=")[0] for p in _DEB_PACKAGES]
        log.warning("the pinned sid ROCm versions are gone from the mirror; taking sid's current ones")
        apt_get(["download", *names], "download (unpinned ROCm debs)", debs)
    found = sorted(debs.glob("*.deb"))
    if len(found) < len(_DEB_PACKAGES):
        raise TunerError(
            f"apt-get download fetched {len(found)} of {len(_DEB_PACKAGES)} packages into {debs}; "
            f"see {log_file}. Rerun `tuner toolchain hip`."
        )
    done.touch()
    return found


def _unpack(prefix: Path, debs: Sequence[Path], logs: Path) -> None:
    root = prefix / "root"
    tmp = prefix / "root.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for deb in debs:
        _run.run(["dpkg-deb", "-x", deb, tmp], log_file=logs / "unpack.log", what=f"dpkg-deb -x {deb.name}")
    # hip-config.cmake's set_and_check(hip_BIN_INSTALL_DIR) fails when usr/bin is absent.
    (tmp / "usr" / "bin").mkdir(parents=True, exist_ok=True)
    libdir = tmp / "usr" / "lib" / "x86_64-linux-gnu"
    stub_c = prefix / "rocblas_stub.c"
    stub_c.write_text("/* empty: rocblas CMake targets only check that the library exists */\n")
    argv: list[str | os.PathLike[str]] = ["gcc", "-shared", "-fPIC", "-o", libdir / "librocblas.so.4.4", stub_c]
    _run.run(argv, log_file=logs / "unpack.log", what="gcc (rocblas stub)")
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)


def _make_venv(prefix: Path, logs: Path) -> None:
    venv = prefix / "venv"
    cmake = venv / "bin" / "cmake"
    if cmake.exists():
        return
    shutil.rmtree(venv, ignore_errors=True)
    _run.run([sys.executable, "-m", "venv", venv], log_file=logs / "venv.log", what="python -m venv")
    _run.run(
        [venv / "bin" / "python", "-m", "pip", "install", "--disable-pip-version-check", _CMAKE_SPEC],
        log_file=logs / "venv.log",
        timeout=600,
        what=f"pip install '{_CMAKE_SPEC}'",
    )


def run_hip_setup(prefix: Path | None = None) -> tuple[HipToolchain, bool]:
    """Set up the HIP compile-check toolchain in ``prefix`` (idempotent): ``(toolchain, did_work)``.

    Raises TunerError when apt-get needs root (the message says what to run) or a download failed.
    """
    prefix = Path(prefix) if prefix is not None else default_prefix()
    tc = find_hip_toolchain(prefix)
    if tc is not None:
        return tc, False
    prefix.mkdir(parents=True, exist_ok=True)
    logs = prefix / "logs"
    (prefix / "toolchain.json").unlink(missing_ok=True)
    with log.step("Installing clang-19 (Debian bookworm)"):
        _install_clang(logs)
    with log.step("Fetching ROCm 6.4 -dev packages (private APT config: trixie + sid)"):
        debs = _download_debs(prefix, logs)
    with log.step(f"Unpacking {len(debs)} packages into {prefix / 'root'}"):
        _unpack(prefix, debs, logs)
    with log.step(f"Installing {_CMAKE_SPEC} into {prefix / 'venv'}"):
        _make_venv(prefix, logs)
    tc = _toolchain_from(prefix)
    if not tc.device_archs:
        msg = f"No gfx device libraries were found in {tc.device_lib_path}; see {logs}. Rerun `tuner toolchain hip`."
        raise TunerError(msg)
    (tc.prefix / "env.sh").write_text(f"""\
# Source this to use tuner's HIP compile-check toolchain by hand.
export ROCM_PATH={tc.rocm_path}
export HIP_PLATFORM=amd
export HIP_CLANG={tc.clangxx}
export HIP_CMAKE={tc.cmake}
export HIP_COMPILE_FLAGS="{tc.compile_flags}"
export HIP_CMAKE_HIP_FLAGS="{tc.defines()["CMAKE_HIP_FLAGS"]}"
export HIP_CMAKE_PREFIX_PATH={tc.rocm_path}
""")
    archs, names = list(tc.device_archs), [p.name for p in debs]
    stamp = {"recipe": _RECIPE, "hip_version": tc.hip_version, "device_archs": archs, "debs": names}
    (prefix / "toolchain.json").write_text(json.dumps(stamp, indent=2) + "\n")
    found = find_hip_toolchain(prefix)
    assert found is not None, "setup finished but the toolchain is incomplete"
    return found, True


_TARGET_RE = re.compile(rb"amdgcn-amd-amdhsa-[a-z]*-(gfx[0-9a-z]+)")


def parse_offload_targets(data: bytes) -> list[str]:
    """Sorted gfx targets named by the HIP offload bundle entries (``hipv4-amdgcn-amd-amdhsa--gfx1151``) in the
    bytes of a compiled object (its ``.hip_fatbin`` section holds the bundle)."""
    return sorted({m.group(1).decode() for m in _TARGET_RE.finditer(data)})


_CHECK_SRC = """\
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
__global__ void k(float *x, const __half *h) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    x[i] = expf(x[i]) + __half2float(h[i]) + __shfl_xor(x[i], 1);
}
"""


def run_hip_check(tc: HipToolchain, archs: Sequence[str] = HIP_ARCHS) -> dict[str, str]:
    """Compile a small kernel (hip_runtime.h, hip_fp16.h, ocml's expf, a shuffle) for each arch.

    Returns arch -> ``"ok"`` or why it failed (missing device library, compile error, no code object).
    """
    out: dict[str, str] = {}
    work = tc.prefix / "check"
    work.mkdir(parents=True, exist_ok=True)
    src = work / "check.hip"
    src.write_text(_CHECK_SRC)
    for arch in archs:
        if not _ARCH_RE.match(arch):
            raise UsageError(f"{arch!r} is not a gfx target name (e.g. gfx1151).")
        if arch not in tc.device_archs:
            out[arch] = f"no device library oclc_isa_version_{arch[3:]}.bc"
            continue
        obj = work / f"check-{arch}.o"
        obj.unlink(missing_ok=True)
        res = _run.run(
            [tc.clangxx, "-x", "hip", *tc.compile_flags.split(), f"--offload-arch={arch}", "-O3", "-c", src, "-o", obj],
            env=tc.env(),
            check=False,
            timeout=300,
            log_file=work / f"check-{arch}.log",
            what=f"clang++ -x hip for {arch}",
        )
        if res.returncode != 0:
            out[arch] = f"compile failed (exit {res.returncode}); see {work / f'check-{arch}.log'}"
        elif arch not in parse_offload_targets(obj.read_bytes()):
            out[arch] = f"compiled, but {obj} holds no {arch} code object"
        else:
            out[arch] = "ok"
    return out
