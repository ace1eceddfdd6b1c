"""The arch database: GPU families, their limits, math units, llama.cpp kernel paths and products.

Data lives in ``tuner/data/archs.toml``; every figure there carries a ``source`` string. This module
loads and validates it (a broken data file is a :class:`~tuner.errors.TunerError` naming the file,
the arch and the key) and resolves user spellings such as ``sm89``, ``8.9`` or ``strix-halo``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from tuner import _run
from tuner._compat import tomllib
from tuner.errors import TunerError, UsageError, close_matches
from tuner.paths import package_data

logger = logging.getLogger(__name__)

MATH_KEYS = ("dp4a", "int8_mma", "int8_wmma", "int8_mfma", "fp16_mma", "fp16_wmma", "fp16_mfma", "fast_fp16")
"""Hardware math-unit flags every arch must state (``mma`` = NVIDIA mma.sync tensor cores,
``wmma`` = AMD RDNA WMMA or nvcuda::wmma, ``mfma`` = AMD CDNA MFMA)."""

PRODUCT_FIGURES = ("bandwidth_gbps", "fp16_tflops", "int8_tops", "fp32_tflops", "units", "memory_gb")
"""Optional numeric product fields; each one present needs an entry in the product's ``sources``."""

_VENDORS = ("nvidia", "amd", "cpu")
_ERA_KEYS = ("quant_matmul", "fa_decode", "fa_prefill", "source")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Product:
    """A named GPU (or host) of an arch, with the peaks the roofline estimate uses."""

    name: str
    bandwidth_gbps: float | None = None
    """Peak memory bandwidth in GB/s (1e9 bytes/s); None when unknown (CPU: pass --bandwidth)."""
    fp16_tflops: float | None = None
    """Dense FP16 peak (tensor/matrix units where present, FP32 accumulate on GeForce)."""
    int8_tops: float | None = None
    """Dense INT8 peak (tensor/matrix units or dp4a)."""
    fp32_tflops: float | None = None
    units: int | None = None
    """SMs (NVIDIA) or CUs (AMD)."""
    memory_gb: float | None = None
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Field name -> where the figure comes from."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Arch:
    """One GPU architecture (or ``cpu``) as llama.cpp sees it."""

    name: str
    """Canonical name: ``sm_89``, ``gfx1151``, ``cpu``."""
    vendor: str
    """``nvidia``, ``amd`` or ``cpu``."""
    family: str
    wave_size: int
    smem_static: int
    """Static shared memory (NVIDIA) / LDS (AMD) per block in bytes."""
    smem_optin: int
    """Dynamic opt-in shared memory per block in bytes (AMD: the LDS size)."""
    cc: int | None = None
    """NVIDIA compute capability times 100 (llama.cpp's ``cc``), e.g. 890."""
    gfx: str | None = None
    math: Mapping[str, bool] = dataclasses.field(default_factory=dict)
    kernel_paths: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)
    """Era (``mma``/``rocwmma``) -> quant_matmul, fa_decode, fa_prefill, source (+ extras)."""
    products: tuple[Product, ...] = ()
    aliases: tuple[str, ...] = ()
    source: str = ""
    """Where cc, wave_size and the shared-memory figures come from."""

    @property
    def backend(self) -> str:
        """ggml's backend name for this arch: ``CUDA``, ``ROCm`` or ``CPU`` (device 0 is ``CUDA0``...)."""
        return {"nvidia": "CUDA", "amd": "ROCm"}.get(self.vendor, "CPU")

    def product(self, name: str | None = None) -> Product:
        """The named product (case-insensitive substring), or the first one listed; UsageError if none matches."""
        if name is None:
            return self.products[0]
        want = name.lower()
        for p in self.products:
            if want == p.name.lower() or want in p.name.lower():
                return p
        names = [p.name for p in self.products]
        raise UsageError(
            f"Arch {self.name} has no product matching {name!r}.{close_matches(name, names)} "
            f"Known products: {', '.join(names)}."
        )

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-able dict (what ``tuner archs show --json`` prints)."""
        d = dataclasses.asdict(self)
        d["math"] = dict(self.math)
        d["kernel_paths"] = {k: dict(v) for k, v in self.kernel_paths.items()}
        d["products"] = [{**dataclasses.asdict(p), "sources": dict(p.sources)} for p in self.products]
        d["aliases"] = list(self.aliases)
        return d


_ARCH_KEYS = {f.name for f in dataclasses.fields(Arch)} - {"name"}


def _bad(path: Path, arch: str, key: str, why: str) -> TunerError:
    return TunerError(
        f"{path}: arch {arch!r}, key {key!r}: {why}. Fix the data file (every arch needs vendor, family, wave_size, "
        "smem_static, smem_optin, source, [math], [kernel_paths.<era>] and [[products]]); see the comment at its top."
    )


def _need(tbl: Mapping[str, object], key: str, typ: type | tuple[type, ...], path: Path, arch: str) -> Any:
    if key not in tbl:
        raise _bad(path, arch, key, "missing")
    val = tbl[key]
    # bool is an int subclass; never accept it where a number is wanted.
    if not isinstance(val, typ) or (isinstance(val, bool) and typ is not bool):
        raise _bad(path, arch, key, f"expected {getattr(typ, '__name__', typ)}, got {val!r}")
    return val


def _parse_product(raw: Mapping[str, object], path: Path, arch: str, i: int) -> Product:
    where = f"products[{i}]"
    name = _need(raw, "name", str, path, arch)
    sources = raw.get("sources", {})
    if not isinstance(sources, dict):
        raise _bad(path, arch, f"{where}.sources", "expected a table")
    unknown = set(raw) - {"name", "sources", *PRODUCT_FIGURES}
    if unknown:
        raise _bad(path, arch, f"{where}.{sorted(unknown)[0]}", "unknown key")
    figures: dict[str, Any] = {}
    for key in [k for k in PRODUCT_FIGURES if k in raw]:
        val = raw[key]
        if isinstance(val, bool) or not isinstance(val, (int, float)) or val <= 0:
            raise _bad(path, arch, f"{where}.{key}", f"expected a positive number, got {val!r}")
        if not isinstance(sources.get(key), str) or not sources[key].strip():
            raise _bad(path, arch, f"{where}.sources.{key}", "every figure needs a source string")
        figures[key] = int(val) if key == "units" else float(val)
    return Product(name=name, sources=dict(sources), **figures)


def _parse_arch(name: str, raw: Mapping[str, object], path: Path) -> Arch:
    unknown = set(raw) - _ARCH_KEYS
    if unknown:
        key = sorted(unknown)[0]
        raise _bad(path, name, key, f"unknown key{close_matches(key, _ARCH_KEYS)}")
    vendor = _need(raw, "vendor", str, path, name)
    if vendor not in _VENDORS:
        raise _bad(path, name, "vendor", f"must be one of {_VENDORS}, got {vendor!r}")
    family = _need(raw, "family", str, path, name)
    wave = _need(raw, "wave_size", int, path, name)
    smem_static = _need(raw, "smem_static", int, path, name)
    smem_optin = _need(raw, "smem_optin", int, path, name)
    source = _need(raw, "source", str, path, name)
    if wave not in (1, 32, 64):
        raise _bad(path, name, "wave_size", f"must be 32 or 64 (1 for cpu), got {wave}")
    if smem_optin < smem_static:
        raise _bad(path, name, "smem_optin", f"{smem_optin} is below smem_static {smem_static}")
    cc = gfx = None
    if vendor == "nvidia":
        cc = _need(raw, "cc", int, path, name)
        if name != f"sm_{cc // 10}":
            raise _bad(path, name, "cc", f"{cc} does not match the arch name (sm_XY means cc XY0)")
    elif vendor == "amd":
        gfx = _need(raw, "gfx", str, path, name)
        if gfx != name:
            raise _bad(path, name, "gfx", f"{gfx!r} does not match the arch name")
    math = _need(raw, "math", dict, path, name)
    for key in MATH_KEYS:
        _need(math, key, bool, path, f"{name}.math")
    _need(math, "source", str, path, f"{name}.math")
    kp_raw = _need(raw, "kernel_paths", dict, path, name)
    if not kp_raw:
        raise _bad(path, name, "kernel_paths", "needs at least one era table")
    kernel_paths: dict[str, dict[str, str]] = {}
    for era, tbl in kp_raw.items():
        if not isinstance(tbl, dict):
            raise _bad(path, name, f"kernel_paths.{era}", "expected a table")
        for key in _ERA_KEYS:
            _need(tbl, key, str, path, f"{name}.kernel_paths.{era}")
        kernel_paths[era] = {str(k): str(v) for k, v in tbl.items()}
    products_raw = _need(raw, "products", list, path, name)
    if not products_raw:
        raise _bad(path, name, "products", "needs at least one product")
    products = tuple(_parse_product(p, path, name, i) for i, p in enumerate(products_raw))
    aliases = raw.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise _bad(path, name, "aliases", "expected a list of strings")
    return Arch(
        name=name,
        vendor=vendor,
        family=family,
        wave_size=wave,
        smem_static=smem_static,
        smem_optin=smem_optin,
        cc=cc,
        gfx=gfx,
        math=dict(math),
        kernel_paths=kernel_paths,
        products=products,
        aliases=tuple(a.lower() for a in aliases),
        source=source,
    )


def load_archs(path: Path | None = None) -> dict[str, Arch]:
    """Canonical arch name -> Arch, in file order, from ``path`` (default the packaged ``archs.toml``).

    Raises TunerError when the file is unreadable or an arch lacks a key or has a bad value.
    """
    return dict(_load_cached(path or package_data("archs.toml")))


@functools.lru_cache(maxsize=8)
def _load_cached(path: Path) -> tuple[tuple[str, Arch], ...]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise TunerError(f"Cannot read the arch database {path}: {err}. Reinstall tuner or fix the file.") from err
    archs = data.get("archs")
    if not isinstance(archs, dict) or not archs:
        raise TunerError(f"{path}: no [archs.<name>] tables. Reinstall tuner or fix the file.")
    out = tuple((name, _parse_arch(name, raw, path)) for name, raw in archs.items())
    seen: dict[str, str] = {}
    for name, arch in out:
        for alias in arch.aliases:
            if alias in seen or alias in archs:
                raise _bad(path, name, "aliases", f"alias {alias!r} is already used by {seen.get(alias, alias)!r}")
            seen[alias] = name
    return out


_SM_RE = re.compile(r"^(?:sm|compute|cc)?[_-]?(\d{2,3})[a-z]?$")
_DOTTED_RE = re.compile(r"^(\d{1,2})\.(\d)$")


def normalize_arch_name(name: str) -> str:
    """Canonical spelling of a user-typed arch: ``SM89``/``sm_89``/``89``/``8.9`` -> ``sm_89``.

    Names that are not NVIDIA spellings are only lower-cased (``GFX1151`` -> ``gfx1151``).
    """
    s = name.strip().lower()
    if m := _DOTTED_RE.match(s):
        return f"sm_{m.group(1)}{m.group(2)}"
    if m := _SM_RE.match(s):
        return f"sm_{m.group(1)}"
    return s


def load_arch(name: str) -> Arch:
    """One arch by name or alias, case-insensitive (``sm89``, ``8.9``, ``gfx1151``, ``strix-halo``, ``cpu``).

    Raises UsageError listing the closest names for an unknown arch.
    """
    archs = load_archs()
    key = normalize_arch_name(name)
    if key in archs:
        return archs[key]
    for arch in archs.values():
        if key in arch.aliases:
            return arch
    choices = list(archs) + [a for arch in archs.values() for a in arch.aliases]
    raise UsageError(
        f"Unknown arch {name!r}.{close_matches(key, choices)} Known archs: {', '.join(archs)}. "
        "Run `tuner archs` for the table."
    )


def find_product(device: str) -> tuple[str, str] | None:
    """(arch, product) whose model number names ``device`` (e.g. "NVIDIA H100 80GB HBM3" -> H100 SXM5).

    A product's model number is the first word of its name with a digit in it ("H100", "4060");
    it must appear as a word of the device string. ``None`` when no product matches.
    """
    words = set(re.findall(r"[a-z0-9]+", device.lower()))
    for arch in load_archs().values():
        for p in arch.products:
            model = next((w for w in re.findall(r"[a-z0-9]+", p.name.lower()) if re.search(r"\d", w)), None)
            if model and model in words:
                return arch.name, p.name
    return None


def local_gpu_names() -> list[str]:
    """Names of this machine's NVIDIA GPUs as the driver reports them ("NVIDIA H200"): NVML, else
    nvidia-smi; ``[]`` when there is none (or no tool)."""

    def name(nvml: ModuleType, handle: object) -> str:
        raw = nvml.nvmlDeviceGetName(handle)
        return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)

    smi = ("--query-gpu=name", "--format=csv,noheader")
    return _nvml_each(name, smi, lambda out: [ln.strip() for ln in out.splitlines() if ln.strip()])


def local_product(arch: str) -> tuple[str, str] | None:
    """(product, device name) of this machine's first GPU that is a product of ``arch`` (an H200 for
    sm_90 on an H200, where the arch's first product is the H100); None when no local GPU is one."""
    for device in local_gpu_names():
        found = find_product(device)
        if found is not None and found[0] == arch:
            return found[1], device
    return None


def newer_nvidia(cc: int, local: Sequence[str]) -> list[str]:
    """The local NVIDIA GPUs (``sm_XY`` names) newer than compute capability ``cc`` (e.g. 890).

    A GPU the database does not know yet counts by its name (``sm_100`` -> 1000).
    """
    out = []
    for name in local:
        if not name.startswith("sm_"):
            continue
        try:
            local_cc = load_arch(name).cc or 0
        except UsageError:
            digits = name.removeprefix("sm_")
            local_cc = int(digits) * 10 if digits.isdigit() else 0
        if local_cc > cc:
            out.append(name)
    return out


_GFX_RE = re.compile(r"\b(gfx[0-9a-f]{3,4})\b")


def _tool_output(name: str, *args: str) -> str:
    """Output of a GPU query tool on PATH; ``""`` when it is missing or fails (then there is no such GPU)."""
    exe = shutil.which(name)
    if exe is None:
        return ""
    try:
        res = _run.run([exe, *args], check=False, timeout=60, what=name)
    except TunerError as err:
        logger.info("%s failed: %s", name, err)
        return ""
    return res.output if res.returncode == 0 else ""


_T = TypeVar("_T")


def _nvml_each(
    query: Callable[[ModuleType, object], _T], smi: Sequence[str], parse: Callable[[str], list[_T]]
) -> list[_T]:
    """``query(pynvml, handle)`` for every NVIDIA device, ``[]`` when NVML finds no usable device; where pynvml is
    not importable, ``parse`` of ``nvidia-smi SMI...`` (the driver ships it, so it works without pynvml)."""
    try:
        import pynvml  # from nvidia-ml-py (optional extra)
    except ImportError:
        return parse(_tool_output("nvidia-smi", *smi))
    try:
        pynvml.nvmlInit()
    except Exception as err:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...: no NVIDIA GPU here
        logger.info("NVML not usable: %s", err)
        return []
    found = []
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            found.append(query(pynvml, pynvml.nvmlDeviceGetHandleByIndex(i)))
    except Exception as err:
        logger.info("NVML query failed: %s", err)
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # shutting down a half-initialised NVML must not hide what we found
            pass
    return found


def _detect_nvidia() -> list[str]:
    def cc(nvml: ModuleType, handle: object) -> str:
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        return f"sm_{major}{minor}"

    smi = ("--query-gpu=compute_cap", "--format=csv,noheader")
    return _nvml_each(cc, smi, lambda out: [f"sm_{a}{b}" for a, b in re.findall(r"^\s*(\d+)\.(\d+)\s*$", out, re.M)])


def gpu_free_bytes() -> int | None:
    """Free memory summed over the NVIDIA GPUs (llama.cpp splits offloaded layers across them):
    NVML, else nvidia-smi; None when unknown (no NVIDIA GPU, or an AMD one: not queried here)."""
    free = _nvml_each(
        lambda nvml, h: int(nvml.nvmlDeviceGetMemoryInfo(h).free),
        ("--query-gpu=memory.free", "--format=csv,noheader,nounits"),
        lambda out: [int(m) << 20 for m in re.findall(r"^\s*(\d+)\s*$", out, re.M)],
    )
    return sum(free) if free else None


def detect_local_archs() -> list[str]:
    """Archs of the GPUs in this machine: NVML (else nvidia-smi) for NVIDIA, ``rocminfo`` for AMD.

    Asked once per process (NVML start-up and rocminfo take a while, and a search asks again and again;
    the GPUs do not change under a running process). :func:`forget_local_archs` asks again next time.
    Canonical names, each once, in device order, including names not in the database (the caller says so).
    """
    return list(_local_archs())  # a new list each call: a caller's change never reaches the next one


def forget_local_archs() -> None:
    """Drop what :func:`detect_local_archs` found, so the next call queries the devices again (tests)."""
    _local_archs.cache_clear()


@functools.cache
def _local_archs() -> tuple[str, ...]:
    found = _detect_nvidia() + _GFX_RE.findall(_tool_output("rocminfo"))
    return tuple(dict.fromkeys(normalize_arch_name(name) for name in found))
