"""Render one build variant: CMake defines from ``templates/cmake`` and kernel patches from ``templates/patches``.

A variant is a CMake define set (``templates/cmake/<variant>.j2``) plus, for GPU variants, the era's
patch manifests (``templates/patches/<era>/*.toml``): edits anchored on exact text of the pristine tree.
Compile-time knob values become per-TU override headers (``RenderedVariant.tu_headers``) that the
CMake hook force-includes, so a candidate rebuilds only the translation units it changes. In baked
mode (``tuner export``) the same values are written into the sources instead and no env is read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from tuner.errors import TunerError, UsageError, close_matches
from tuner.plan import constraints, fa_rules, tu_split
from tuner.plan import space as space_mod
from tuner.plan.fa_rules import KERNEL_ENUMS
from tuner.plan.patch import render_patch, render_template
from tuner.plan.variant import VARIANTS, RenderedVariant, variant_family
from tuner.source.tree import load_cmake_options
from tuner.targets import models
from tuner.targets.archs import newer_nvidia

if TYPE_CHECKING:
    from tuner.plan.space import SearchSpace

logger = logging.getLogger(__name__)

_ERA_ONLY = {"hip-rocwmma": "rocwmma"}

# CMake builtins a template may set besides the options the tree declares.
_CMAKE_BUILTINS = frozenset(
    {
        "CMAKE_BUILD_TYPE",
        "CMAKE_CUDA_ARCHITECTURES",
        "CMAKE_HIP_ARCHITECTURES",
        "CMAKE_BUILD_RPATH_USE_ORIGIN",
        "CMAKE_POSITION_INDEPENDENT_CODE",
        "CMAKE_EXPORT_COMPILE_COMMANDS",
    }
)
# Plain variables (not option()/CACHE) that ggml-hip/CMakeLists.txt reads; allowed only where referenced.
_HIP_TARGET_VARS = ("GPU_TARGETS", "AMDGPU_TARGETS")
_SAFE_VALUE = re.compile(r"^[A-Za-z0-9_.;+\-]*$")
_THRESHOLD_DEFAULTS = {1: 4, 2: 256, 3: 8192, 4: 2, 5: 8, 6: 16, 7: 2, 8: 2147483647}
_INT_MAX = 2147483647


# --------------------------------------------------------------------------- CMake defines


def _declared_options(root: Path) -> set[str]:
    """Names of every option()/CACHE entry the tree declares (:func:`tuner.source.tree.load_cmake_options`)."""
    top = root / "CMakeLists.txt"
    stamp = top.stat().st_mtime_ns if top.is_file() else 0
    return set(_declared_options_cached(str(root), stamp))


@functools.lru_cache(maxsize=8)
def _declared_options_cached(root_s: str, stamp: int) -> frozenset[str]:
    root = Path(root_s)
    names = set(load_cmake_options(root))
    hip = root / "ggml" / "src" / "ggml-hip" / "CMakeLists.txt"
    if hip.is_file():
        text = hip.read_text(errors="replace")
        names.update(v for v in _HIP_TARGET_VARS if re.search(rf"\b{v}\b", text))
    return frozenset(names)


def _cuda_arch_value(arch: constraints.ArchLimits, local_archs: Sequence[str] | None) -> tuple[str, list[str]]:
    """``90-real``; a non-local Ada/Hopper target on a newer local GPU becomes ``-virtual`` (PTX JIT)."""
    major = str(arch.cc // 10)
    if not local_archs or arch.name in local_archs:
        return f"{major}-real", []
    if newer_nvidia(arch.cc, local_archs):
        warn = (
            f"{arch.name} was requested but this machine's GPU is {', '.join(local_archs)}: building "
            f"CMAKE_CUDA_ARCHITECTURES={major}-virtual (PTX, JIT-compiled at first run) so it can run here. "
            f"Host logic sees the real GPU; set CUDA_CACHE_MAXSIZE high so the JIT result is cached."
        )
        return f"{major}-virtual", [warn]
    warn = f"{arch.name} binaries ({major}-real) will not run on this machine's GPU ({', '.join(local_archs)})."
    return f"{major}-real", [warn]


def render_defines(
    source_root: Path, arch: str, variant: str, era: str, *, local_archs: Sequence[str] | None = None
) -> tuple[dict[str, str], list[str]]:
    """Render ``templates/cmake/<variant>.j2`` into ``(defines, warnings)``, checked against the tree.

    Only options the tree declares may be set; ``local_archs`` (this machine's GPUs) decides ``89-real`` vs
    ``89-virtual``. Raises UsageError for an unknown variant or one that does not fit the arch or era,
    TunerError when a template sets an undeclared option or an unsafe value.
    """
    if variant not in VARIANTS:
        msg = f"Unknown variant {variant!r}.{close_matches(variant, VARIANTS)} Known: {', '.join(VARIANTS)}."
        raise UsageError(msg)
    limits = constraints.load_arch_limits(arch)
    family = variant_family(variant)
    want_vendor = {"cpu": "cpu", "cuda": "nvidia", "hip": "amd"}[family]
    if limits.vendor != want_vendor:
        raise UsageError(
            f"Variant {variant!r} builds for {want_vendor} but arch {arch!r} is {limits.vendor}. "
            f"Pick a {limits.vendor} variant (e.g. {'cuda' if limits.vendor == 'nvidia' else 'hip' if limits.vendor == 'amd' else 'cpu'})."
        )
    need_era = _ERA_ONLY.get(variant)
    if need_era and era != need_era:
        raise TunerError(
            f"Variant {variant!r} needs the rocWMMA FlashAttention kernel, which upstream removed in PR #26046 "
            f'("HIP: remove rocWMMA FlashAttention"); this source is era {era!r}. Use '
            f"--source pypi:llama-cpp-python==0.3.16 (a 2025-08 llama.cpp that still has GGML_HIP_ROCWMMA_FATTN), "
            f"or pick variant 'hip'."
        )
    cuda_arch, warnings = _cuda_arch_value(limits, local_archs) if limits.vendor == "nvidia" else ("", [])
    declared = _declared_options(source_root)
    template = f"cmake/{variant}.j2"
    context = {
        "arch": arch,
        "era": era,
        "cuda_arch": cuda_arch,
        "gpu_target": limits.gfx or "",
        "declared": sorted(declared),
    }
    text = render_template(template, context, what=f"CMake defines for variant {variant}")
    defines: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):  # NAME=VALUE lines; '#' comments and blanks ignored
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not re.fullmatch(r"[A-Z][A-Z0-9_]*", name):
            raise TunerError(f"Template {template!r} line {n} renders {raw!r}, not NAME=VALUE. Fix the template.")
        if name in defines and defines[name] != value:
            msg = f"Template {template!r} sets {name} twice ({defines[name]!r}, {value!r}). Fix the template."
            raise TunerError(msg)
        defines[name] = value
    for name, value in defines.items():
        if name not in declared and name not in _CMAKE_BUILTINS:
            raise TunerError(
                f"Template {template!r} sets {name}, which the llama.cpp tree at {source_root} does not declare "
                f"(era {era}).{close_matches(name, declared)} Guard it with {{% if {name!r} in declared %}} or remove it."
            )
        if not _SAFE_VALUE.match(value):
            raise TunerError(f"Template {template!r} renders {name}={value!r}; values may only use [A-Za-z0-9_.;+-].")
    return defines, warnings


def render_preset(
    rv: RenderedVariant, *, name: str | None = None, tree_presets: Path | None = None
) -> dict[str, object]:
    """A ``CMakeUserPresets.json`` document with one configure preset for ``rv``.

    The schema version follows the tree's ``CMakePresets.json``, and the preset inherits the tree's
    ``base`` and ``release`` presets when they exist, so it can be dropped next to llama.cpp's own file.
    """
    tree_presets = tree_presets or rv.source_root / "CMakePresets.json"
    version, inherits = 4, []
    if tree_presets.is_file():
        try:
            doc = json.loads(tree_presets.read_text())
        except json.JSONDecodeError as err:
            raise TunerError(f"{tree_presets} is not valid JSON ({err}).") from err
        version = int(doc.get("version", 4))
        names = {p.get("name") for p in doc.get("configurePresets", [])}
        inherits = [n for n in ("base", "release") if n in names]
    preset: dict[str, object] = {
        "name": name or f"tuner-{rv.arch}-{rv.variant}",
        "displayName": f"tuner {rv.arch} {rv.variant} ({rv.era})",
        "cacheVariables": dict(rv.defines),
    }
    if inherits:
        preset["inherits"] = inherits
    else:
        preset["generator"] = "Ninja"
        preset["binaryDir"] = "${sourceDir}/build-${presetName}"
    return {"version": version, "configurePresets": [preset]}


def render_presets(rv: RenderedVariant, *, name: str | None = None) -> str:
    """:func:`render_preset` as JSON text (what ``tuner export`` writes)."""
    return json.dumps(render_preset(rv, name=name), indent=2) + "\n"


# -------------------------------------------------------------------- Compile-time knobs -> per-TU headers / baked rows

_INSTANCES = "ggml/src/ggml-cuda/template-instances"
_WMMA_TU = "ggml/src/ggml-cuda/fattn-wmma-f16.cu"
_TU_GLOBS = {"mma": (f"{_INSTANCES}/fattn-tile*.cu", tu_split.MMA_GLOB), "rocwmma": (_WMMA_TU,)}
_WMMA_MACROS = {
    "nwarps": "GGML_TUNER_WMMA_NWARPS",
    "min_blocks": "GGML_TUNER_WMMA_MIN_BLOCKS",
    "kq_stride": "GGML_TUNER_WMMA_KQ_STRIDE",
}
_WMMA_DEFAULTS = {"nwarps": 4, "min_blocks": 1, "kq_stride": 256}


def tu_header_name(tu: str) -> str:
    """File name of the override header for a TU (``.../fattn-mma-f16-instance-ncols1_16-ncols2_4.cu`` -> ``…ncols2_4.h``).

    The CMake hook computes the same name with ``get_filename_component(... NAME_WE)``.
    """
    return Path(tu).name.split(".", 1)[0] + ".h"


def find_hooked_tus(source_root: Path, era: str, family: str = "cuda") -> list[str]:
    """Relative paths of every TU the era's CMake hook gives an override header.

    For CUDA builds of era ``mma`` an MMA instance with DECL lines is replaced by its per-head-size
    split TUs (:func:`tuner.plan.tu_split.split_tus`), which exist only in a configured build's source copy.
    """
    out: set[str] = set()
    for pattern in _TU_GLOBS.get(era, ()):
        out.update(p.relative_to(source_root).as_posix() for p in source_root.glob(pattern))
    if tu_split.splits_mma(era, family):
        splits = tu_split.split_tus(source_root)
        out.difference_update(splits.values())
        out.update(splits)
    return sorted(out)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _RowOverride:
    kind: str  # tile | mma
    table: str
    row: constraints.TileRow | constraints.MmaRow
    tu: str


def _row_overrides(
    source_root: Path, sp: SearchSpace, values: Mapping[str, int], *, era: str = "", family: str = ""
) -> tuple[list[_RowOverride], dict[str, int]]:
    """Group tile/MMA row knobs into full rows (untuned fields from the tree's table); wmma values apart.

    ``tu`` is the TU whose header carries the row: for a CUDA build of era ``mma`` an MMA row's head
    size's split TU, otherwise the whole instance file (a tile instance is one head size already).
    """
    groups: dict[tuple[str, str, tuple[int, int, int], int], dict[str, int]] = {}
    wmma: dict[str, int] = {}
    for knob in sp.compile_knobs:
        if knob.name not in values:
            continue
        v = int(values[knob.name])
        if knob.kind == "wmma":
            wmma[str(knob.meta["field"])] = v
            continue
        m = knob.meta
        key = (int(m["dkq"]), int(m["dv"]), int(m["ncols"]))
        ncols2 = int(m.get("ncols2", 0))
        groups.setdefault((knob.kind, str(m["table"]), key, ncols2), {})[str(m["field"])] = v
    out = []
    split = tu_split.splits_mma(era, family)
    for (kind, table, key, ncols2), fields in groups.items():
        upstream = space_mod.upstream_row(source_root, kind, table, key)
        row = constraints.with_fields(upstream, fields)
        if row == upstream:
            continue  # identical to upstream: no override, so identical candidates share binaries
        tu = (
            f"{_INSTANCES}/fattn-tile-instance-dkq{key[0]}-dv{key[1]}.cu"
            if kind == "tile_row"
            else f"{_INSTANCES}/fattn-mma-f16-instance-ncols1_{key[2] // ncols2}-ncols2_{ncols2}.cu"
        )
        if not (source_root / tu).is_file():
            raise UsageError(
                f"Knobs for {kind} {table} {key} target {tu}, which this tree lacks; check the knob's ncols2 "
                f"(ncols {key[2]} must be ncols1*ncols2 of an existing fattn-mma-f16 instance)."
            )
        if split and kind != "tile_row":
            whole, tu = tu, tu_split.split_tu_of(source_root, tu, key[0]) or ""
            if not tu:
                raise UsageError(
                    f"Knobs for {kind} {table} {key} target head size {key[0]} of {whole}, which instantiates no "
                    f"DECL_FATTN_MMA_F16_CASE({key[0]}, ...) in this tree; pick a head size that instance compiles."
                )
        out.append(_RowOverride(kind="tile" if kind == "tile_row" else "mma", table=table, row=row, tu=tu))
    return out, wmma


def render_tu_headers(
    source_root: Path, era: str, sp: SearchSpace, values: Mapping[str, int], *, family: str = "cuda"
) -> dict[str, str]:
    """Override header text for every hooked TU ('' where the candidate changes nothing).

    Every hooked TU is listed so the build stage overwrites a header left by an earlier candidate.
    ``family`` (``cuda`` or ``hip``) picks the CMake hook: CUDA's compiles MMA instances per head size.
    """
    headers = {tu: "" for tu in find_hooked_tus(source_root, era, family)}
    rows, wmma = _row_overrides(source_root, sp, values, era=era, family=family)
    per_tu: dict[str, dict[str, list[str]]] = {}
    for r in rows:
        macro = f"GGML_TUNER_{'TILE' if r.kind == 'tile' else 'MMA'}_ROWS_{r.table.upper()}"
        per_tu.setdefault(r.tu, {}).setdefault(macro, []).append(r.row.render())
    for tu, macros in per_tu.items():
        lines = ["// generated by tuner: compile-time candidate rows for this TU only"]
        lines += [f"#define {macro} {' '.join(rows_)}" for macro, rows_ in sorted(macros.items())]
        headers[tu] = "\n".join(lines) + "\n"
    changed = {f: v for f, v in wmma.items() if v != _WMMA_DEFAULTS[f]}
    if changed:
        lines = ["// generated by tuner: WMMA FlashAttention parameters (fattn-wmma-f16.cu)"]
        lines += [f"#define {_WMMA_MACROS[f]} {v}" for f, v in sorted(changed.items())]
        headers[_WMMA_TU] = "\n".join(lines) + "\n"
    return headers


def _baked_context(
    source_root: Path, era: str, sp: SearchSpace | None, values: Mapping[str, int], baked_runtime: Mapping[str, object]
) -> dict[str, object]:
    t = dict(_THRESHOLD_DEFAULTS)
    rules: list[dict[str, object]] = []
    wmma_decode, wmma_min_kv = 0, 0
    for key, raw in baked_runtime.items():
        m = re.fullmatch(r"GGML_TUNER_FA_T([1-8])", key)
        if m:
            t[int(m.group(1))] = _int_value(key, raw, 0, _INT_MAX)
        elif key == "GGML_TUNER_FA_RULES":
            rules += [_baked_rule(r) for r in fa_rules.parse_fa_rules(str(raw))]
        elif key == "GGML_TUNER_WMMA_DECODE":
            wmma_decode = _int_value(key, raw, 0, 1)
        elif key == "GGML_TUNER_WMMA_DECODE_MIN_KV":
            wmma_min_kv = _int_value(key, raw, 0, _INT_MAX)
        elif key == "GGML_TUNER_FA_LOG":
            continue  # logging is an env-mode feature; a baked patch reads no env
        else:
            raise UsageError(
                f"baked_runtime key {key!r} cannot be compiled in. Known: GGML_TUNER_FA_RULES, GGML_TUNER_FA_T1..T8, "
                f"GGML_TUNER_WMMA_DECODE, GGML_TUNER_WMMA_DECODE_MIN_KV. Pass other env vars at run time."
            )
    if len(rules) > fa_rules.FA_RULES_MAX:
        raise UsageError(f"{len(rules)} FA rules given; the hook holds at most {fa_rules.FA_RULES_MAX}.")
    baked_rows: dict[str, list[str]] = {}
    wmma = dict(_WMMA_DEFAULTS)
    if sp is not None:
        rows, wmma_values = _row_overrides(source_root, sp, values)
        for ov in rows:
            baked_rows.setdefault(f"{ov.kind}:{ov.table}", []).append(ov.row.render())
        wmma.update(wmma_values)
    return {
        "t": t,
        "rules": rules,
        # a baked patch carries the batch key only where a rule has one: one without keeps its bytes
        "nb_key": any(r["nb"] != -1 for r in rules),
        "baked_rows": baked_rows,
        "wmma": wmma,
        "wmma_decode": wmma_decode,
        "wmma_min_kv": wmma_min_kv,
    }


def _baked_rule(r: fa_rules.FaRule) -> dict[str, object]:
    """One ``ggml_tuner_fa_rule`` initializer (fattn-knobs.cu.j2) for a parsed rule; -1 = any / unbounded.

    Every value is re-checked here (type, range, allow-list) so nothing unchecked reaches the C++ text,
    whoever built the FaRule.
    """
    if r.phase not in ("decode", "prefill") or r.kernel not in KERNEL_ENUMS:
        raise UsageError(f"FA rule {r.text!r}: phase must be decode|prefill and kernel VEC|TILE|MMA.")

    def num(name: str, v: object, lo: int, hi: int) -> int:
        if type(v) is not int or not lo <= v <= hi:
            raise UsageError(f"FA rule {r.text!r}: {name}={v!r} is not an integer in [{lo}, {hi}].")
        return v

    lo = num("lo", r.lo, 0, 2**62)
    hi = -1 if r.hi is None else num("hi", r.hi, lo + 1, 2**62)
    keys = {}
    for name, (klo, khi) in fa_rules.FA_RULE_KEY_RANGES.items():
        v = getattr(r, name)
        keys[name] = -1 if v is None else num(name, v, klo, khi)
    if r.kv is not None and r.kv not in fa_rules.FA_RULE_KV_TYPES:
        raise UsageError(f"FA rule {r.text!r}: K/V type {r.kv!r} is not one of {', '.join(fa_rules.FA_RULE_KV_TYPES)}.")
    kv = -1 if r.kv is None else f"GGML_TYPE_{r.kv.upper()}"
    phase = 0 if r.phase == "decode" else 1
    return {"phase": phase, "lo": lo, "hi": hi, "kernel": KERNEL_ENUMS[r.kernel], **keys, "kv": kv, "text": r.text}


def _int_value(key: str, raw: object, lo: int, hi: int) -> int:
    try:
        v = int(str(raw))
    except ValueError:
        raise UsageError(f"{key}={raw!r} is not an integer; give an integer in [{lo}, {hi}].") from None
    if not lo <= v <= hi:
        raise UsageError(f"{key}={v} is out of range; give an integer in [{lo}, {hi}].")
    return v


class SourceTree(models.SourceTree, Protocol):
    """What a render reads of a :class:`tuner.source.Source`: its tree, id and era."""

    @property
    def era(self) -> str: ...


def render_variant(
    source: SourceTree,
    arch: str,
    variant: str,
    *,
    compile_values: Mapping[str, int] | None = None,
    baked_runtime: Mapping[str, object] | None = None,
    local_archs: Sequence[str] | None = None,
    model_shape: Mapping[str, int] | None = None,
    space: SearchSpace | None = None,
    checked: bool = False,
    hooks: Sequence[str] = (),
) -> RenderedVariant:
    """Render one variant of one source tree: defines, base patch and per-TU override headers.

    ``compile_values`` (knob name -> value, ``search_spaces/<arch>.toml``) are range-checked against ``space``
    (default: loaded here) and, unless ``checked`` (the search checks each trial once, with the model's shape),
    constraint-checked with ``model_shape`` before anything is rendered. ``baked_runtime``: ``None`` for the
    runtime hook (env read once), else the hook's env values (``GGML_TUNER_FA_RULES``, ``GGML_TUNER_FA_T1``...)
    compiled in as constants, and compile values written into the tables / WMMA defaults instead of per-TU
    headers (export mode). ``local_archs``: this machine's GPUs; ``None`` renders for the target. ``hooks``:
    opt-in hooks (``opt_in`` of ``templates/patches/<era>/*.toml``), e.g. ``("mmq",)`` for the MMQ-vs-cuBLAS
    hook the sweep's build carries; the patch, and so the build directory, differs without them.

    Raises UsageError for an unknown knob, a value out of range or a candidate that breaks a constraint,
    TunerError when a template does not match the tree.

    Example:
        >>> rv = render_variant(src, "sm_90", "cuda", compile_values={"mma.ampere.d64.c64.nthreads": 256})
        >>> sorted(k for k, v in rv.tu_headers.items() if v)  # doctest: +SKIP
        ['ggml/src/ggml-cuda/template-instances/split/fattn-mma-f16-instance-ncols1_16-ncols2_4-dkq64.cu']

        The D64 row at ncols 64 is instantiated by ``fattn-mma-f16-instance-ncols1_16-ncols2_4.cu``; the
        CUDA hook compiles its head sizes as separate TUs, so only the D64 one is rebuilt.
    """
    root = Path(source.root)
    era = str(source.era)
    compile_values = dict(compile_values or {})
    defines, warnings = render_defines(root, arch, variant, era, local_archs=local_archs)
    family = variant_family(variant)
    sp = space  # a CPU build without compile-time values needs none
    if sp is None and (compile_values or family != "cpu"):
        with contextlib.suppress(space_mod.SpaceNotFound):
            sp = space_mod.load_space(arch, era)
    if compile_values:  # range-checked against the space and, unless the caller did (checked), constraint-checked
        if sp is None:
            raise UsageError(f"Compile-time values were given but there is no search space for {arch!r} (era {era}).")
        compile_values = {n: int(v) for n, v in space_mod.check_values(sp, compile_values, section="compile").items()}
        if not checked:
            violations = space_mod.check_constraints(arch, era, compile_values, model_shape, space=sp, source_root=root)
            if violations:
                raise UsageError(
                    f"Candidate {dict(compile_values)} is illegal on {arch} (era {era}): "
                    + "; ".join(v.message for v in violations)
                    + ". Pick values that satisfy these rules (nothing was compiled)."
                )
    patch, opt_in = "", tuple(sorted(set(hooks)))
    files: Mapping[str, str] = {}
    tu_headers: Mapping[str, str] = {}
    if family == "cpu" and hooks:
        raise UsageError(f"A CPU build has no opt-in hooks ({', '.join(hooks)}): they patch GPU sources.")
    if family != "cpu":
        # the patch's template context: the runtime hook's defaults, or (baked) values compiled in
        context: dict[str, object] = {"baked": baked_runtime is not None, "arch": arch, "defaults": _THRESHOLD_DEFAULTS}
        if baked_runtime is not None:
            context.update(_baked_context(root, era, sp, compile_values, baked_runtime))
        else:
            context.update(
                t=_THRESHOLD_DEFAULTS, rules=[], baked_rows={}, wmma=_WMMA_DEFAULTS, wmma_decode=0, wmma_min_kv=0
            )
        patch, files = render_patch(root, era, family, context, opt_in=opt_in)
        if baked_runtime is None:
            tu_headers = (
                render_tu_headers(root, era, sp, compile_values, family=family)
                if sp is not None
                else {tu: "" for tu in find_hooked_tus(root, era, family)}
            )
    return RenderedVariant(
        arch=arch,
        variant=variant,
        era=era,
        source_id=str(source.source_id),
        source_root=root,
        defines=defines,
        patch=patch,
        files=files,
        tu_headers=tu_headers,
        compile_values=compile_values,
        warnings=tuple(warnings),
        hooks=opt_in,
    )
