"""The sweep's FlashAttention table: its rules, its Python matcher and its C++ form in upstream's fattn.cu.

A static array and lookup before ``ggml_cuda_get_best_fattn_kernel``, called at the top of its Turing-and-newer
branch on the exact compute capability measured (:func:`tuner.result.upstream_patch.arch_condition` says why); an
entry applies only where it was measured legal. :func:`match_table` is the lookup in Python.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Sequence
from pathlib import Path

from tuner.errors import TunerError
from tuner.plan.fa_rules import KERNEL_ENUMS, FaRule, Phase
from tuner.result.upstream_patch import COMMON, FATTN, arch_condition, git_diff, kv_type_enum
from tuner.targets.archs import Arch

LOOKUP_PREFIX = "ggml_cuda_fattn_tuned_kernel_"
_FUNCTION = "static best_fattn_kernel ggml_cuda_get_best_fattn_kernel("
_TURING_BRANCH = "    if (turing_mma_available(cc) && Q->ne[0] != 40 && Q->ne[0] != 72) {\n"
_NEEDS = ("const int gqa_ratio", "bool gqa_opt_applies", "const bool can_use_vector_kernel", "const int cc")
_STRUCT = "ggml_cuda_fattn_kernel_choice"


@dataclasses.dataclass(frozen=True, order=True, kw_only=True)
class TableRule:
    """One entry: a shape (``Q->ne[1]`` exactly) and an n_kv interval ``[lo, hi)`` (hi None: unbounded) -> kernel."""

    D: int
    gqa: int
    kv: str
    ne1: int
    lo: int
    hi: int | None
    kernel: str

    @classmethod
    def of(cls, rule: FaRule, *, ne1: int) -> TableRule:
        """A composed rule, keyed to the query columns it was measured at."""
        if rule.D is None or rule.gqa is None or rule.kv is None:
            raise TunerError(f"Rule {rule.text} has no full shape (D, gqa, kv); a sweep table keys every entry.")
        return cls(D=rule.D, gqa=rule.gqa, kv=rule.kv, ne1=ne1, lo=rule.lo, hi=rule.hi, kernel=rule.kernel)

    @property
    def text(self) -> str:
        """``D64 gqa4 f16 ne1 1, n_kv in [32768, inf) -> MMA``: the entry for messages and reports."""
        hi = "inf" if self.hi is None else self.hi
        return f"D{self.D} gqa{self.gqa} {self.kv} ne1 {self.ne1}, n_kv in [{self.lo}, {hi}) -> {self.kernel}"

    def covers(self, n_kv: int) -> bool:
        return self.lo <= n_kv and (self.hi is None or n_kv < self.hi)

    def hook_rule(self, *, widened: bool = False) -> FaRule:
        """The entry as the runtime hook's rule: decode at ``Q->ne[1] = 1``, else prefill keyed to its batch
        (``nb``). ``widened``: every n_kv and, for a batch entry, every batch (test-backend-ops, the gate)."""
        lo, hi = (0, None) if widened else (self.lo, self.hi)
        phase, nb = (Phase.DECODE, None) if self.ne1 == 1 else (Phase.PREFILL, None if widened else self.ne1)
        return FaRule(phase=phase, lo=lo, hi=hi, kernel=self.kernel, D=self.D, gqa=self.gqa, kv=self.kv, nb=nb)


def match_table(
    rules: Sequence[TableRule],
    *,
    D: int,
    gqa: int,
    type_k: str,
    type_v: str,
    ne1: int,
    n_kv: int,
    can_use_vector_kernel: bool,
    gqa_opt_applies: bool,
) -> str | None:
    """The kernel the emitted lookup returns for one call, or None where upstream's choice stays (module doc)."""
    if type_k != type_v:
        return None
    for r in rules:
        if (r.D, r.gqa, r.kv, r.ne1) != (D, gqa, type_k, ne1) or not r.covers(n_kv):
            continue
        if (not can_use_vector_kernel) if r.kernel == "VEC" else (gqa >= 2 and not gqa_opt_applies):
            return None
        return r.kernel
    return None


def widened_layers(rules: Sequence[TableRule]) -> list[list[FaRule]]:
    """The kept entries as widened rules in layers, no shape twice a phase (the hook's first match wins)."""
    layers: list[list[FaRule]] = []
    for r in rules:
        rule = r.hook_rule(widened=True)
        if any(rule in ly for ly in layers):
            continue  # the same kernel for another n_kv range of this shape: widened, it is one rule
        key = (rule.phase, r.D, r.gqa, r.kv)
        free = next((ly for ly in layers if all((x.phase, x.D, x.gqa, x.kv) != key for x in ly)), None)
        if free is None:
            layers.append([rule])
        else:
            free.append(rule)
    return layers


def _check(rules: Sequence[TableRule]) -> None:
    for r in rules:
        if r.kernel not in KERNEL_ENUMS:
            raise TunerError(f"Table entry {r.text}: kernel must be one of {', '.join(KERNEL_ENUMS)}.")
        if r.lo < 0 or (r.hi is not None and r.hi <= r.lo):
            raise TunerError(f"Table entry {r.text}: its n_kv range must satisfy 0 <= lo < hi.")
        kv_type_enum(r.kv)  # raises for a type without FlashAttention support
        if r.kernel == "VEC" and not (r.D <= 256 and r.D % 64 == 0 and r.D != 192):
            raise TunerError(f"Table entry {r.text}: no vector kernel exists for head size {r.D}.")
    for a, b in itertools.combinations(rules, 2):
        same = (a.D, a.gqa, a.kv, a.ne1) == (b.D, b.gqa, b.kv, b.ne1)
        if same and a.lo < (math.inf if b.hi is None else b.hi) and b.lo < (math.inf if a.hi is None else a.hi):
            raise TunerError(f"Table entries {a.text} and {b.text} overlap; one shape's n_kv ranges must be disjoint.")


def _suffix(arch: Arch) -> str:
    return re.sub(r"[^a-z0-9]+", "_", str(getattr(arch, "family", "") or arch.name).lower()).strip("_")


def table_block(rules: Sequence[TableRule], arch: Arch, *, note: str = "") -> str:
    """The static table and its lookup function (C++ lines ending in a newline), for ``arch``."""
    suffix = _suffix(arch)
    rows = [
        f"    {{{r.D:4d}, {r.gqa}, {kv_type_enum(r.kv) + ',':15s} {r.ne1}, {r.lo:6d}, {-1 if r.hi is None else r.hi:6d}, {KERNEL_ENUMS[r.kernel]}}},"
        for r in sorted(rules)
    ]
    head = note.strip() or f"Kernel choices measured on {arch.name}."
    return "\n".join(
        [
            *(f"// {ln}" if ln else "//" for ln in head.splitlines()),
            "// One entry per head size, GQA ratio, K/V type (K and V alike), Q->ne[1] and n_kv range",
            "// [n_kv_min, n_kv_max) (-1: unbounded); a shape not listed keeps the choice below.",
            f"struct {_STRUCT} {{",
            "    int64_t           D;",
            "    int               gqa_ratio;",
            "    ggml_type         type_KV;",
            "    int64_t           ne1;",
            "    int64_t           n_kv_min;",
            "    int64_t           n_kv_max;",
            "    best_fattn_kernel kernel;",
            "};",
            "",
            f"static const {_STRUCT} {_STRUCT}s_{suffix}[] = {{",
            *rows,
            "};",
            "",
            f"static best_fattn_kernel {LOOKUP_PREFIX}{suffix}(",
            "        const int64_t D, const int gqa_ratio, const ggml_type type_K, const ggml_type type_V, const int64_t ne1,",
            "        const int64_t n_kv, const bool can_use_vector_kernel, const bool gqa_opt_applies) {",
            "    if (type_K != type_V) {",
            "        return BEST_FATTN_KERNEL_NONE;",
            "    }",
            f"    for (const {_STRUCT} & c : {_STRUCT}s_{suffix}) {{",
            "        if (c.D != D || c.gqa_ratio != gqa_ratio || c.type_KV != type_K || c.ne1 != ne1 ||",
            "                n_kv < c.n_kv_min || (c.n_kv_max >= 0 && n_kv >= c.n_kv_max)) {",
            "            continue;",
            "        }",
            "        // measured with the vector kernel where it can run, and with the GQA-optimized kernels only:",
            "        if (c.kernel == BEST_FATTN_KERNEL_VEC ? !can_use_vector_kernel : (gqa_ratio >= 2 && !gqa_opt_applies)) {",
            "            return BEST_FATTN_KERNEL_NONE;",
            "        }",
            "        return c.kernel;",
            "    }",
            "    return BEST_FATTN_KERNEL_NONE;",
            "}",
            "",
            "",
        ]
    )


def _call(arch: Arch, cond: str, indent: str = "        ") -> str:
    """The lookup's call, at ``indent``: inside the Turing branch (NVIDIA), or at the function's level (AMD)."""
    lines = [
        f"if ({cond} && Q->ne[3] == 1) {{",
        f"    const best_fattn_kernel tuned = {LOOKUP_PREFIX}{_suffix(arch)}(",
        "        Q->ne[0], gqa_ratio, K->type, V->type, Q->ne[1], K->ne[1], can_use_vector_kernel, gqa_opt_applies);",
        "    if (tuned != BEST_FATTN_KERNEL_NONE) {",
        "        return tuned;",
        "    }",
        "}",
    ]
    return "".join(f"{indent}{ln}\n" for ln in lines)


def patched_fattn_table(root: Path, rules: Sequence[TableRule], arch: Arch, *, note: str = "") -> str | None:
    """fattn.cu of the pristine tree at ``root`` with the table (None for no rules); TunerError for a
    bad arch, entry or tree (not llama.cpp 0c1e570's, docs/selector.md)."""
    rules = list(rules)
    if not rules:
        return None
    amd = getattr(arch, "vendor", None) == "amd"
    if not amd and (getattr(arch, "vendor", None) != "nvidia" or int(getattr(arch, "cc", 0) or 0) < 750):
        raise TunerError(
            f"A sweep table goes into the Turing-and-newer branch or an AMD one; {arch.name!r} has neither."
        )
    _check(rules)
    path, common = root / FATTN, root / COMMON
    if not path.is_file() or not common.is_file():
        raise TunerError(f"{root} has no {FATTN} and {COMMON}; the sweep's patch needs the pristine llama.cpp tree.")
    text = path.read_text()
    start = text.find(_FUNCTION)
    end = text.find("\n}\n", start)
    body = text[start:end] if 0 <= start < end else ""
    missing = [n for n in _NEEDS if n not in body]
    if missing or _TURING_BRANCH not in body or LOOKUP_PREFIX in text:
        raise TunerError(
            f"{FATTN} of {root}: ggml_cuda_get_best_fattn_kernel does not have the structure the sweep's patch is "
            f"written for (missing {', '.join(missing) or repr(_TURING_BRANCH.strip())}, or already patched); "
            "it differs from llama.cpp 0c1e570 (docs/selector.md)."
        )
    if amd:  # before the Turing branch (and its comment), which no AMD device enters; keyed on the family
        branch = start + body.index(_TURING_BRANCH)
        comment = text.rfind("\n", start, branch - 1) + 1
        branch = comment if text[comment:branch].lstrip().startswith("//") else branch
        call = _call(arch, amd_family_condition(arch), indent="    ") + "\n"
    else:
        branch = start + body.index(_TURING_BRANCH) + len(_TURING_BRANCH)
        call = _call(arch, arch_condition(arch, common.read_text()))
    return text[:start] + table_block(rules, arch, note=note) + text[start:branch] + call + text[branch:]


_AMD_FAMILIES = {
    "RDNA3": "GGML_CUDA_CC_IS_RDNA3_0(cc)",
    "RDNA3.5": "GGML_CUDA_CC_IS_RDNA3_5(cc)",
    "RDNA4": "GGML_CUDA_CC_IS_RDNA4(cc)",
    "CDNA3": "GGML_CUDA_CC_IS_CDNA3(cc)",
}


def amd_family_condition(arch: Arch) -> str:
    """Upstream's family macro of the measured AMD GPU (gfx1151 and gfx1150 share RDNA3.5's)."""
    cond = _AMD_FAMILIES.get(str(getattr(arch, "family", "")))
    if cond is None:
        raise TunerError(
            f"No family macro of common.cuh names {arch.name!r} ({getattr(arch, 'family', '?')}); a sweep table for "
            f"AMD is keyed on one of {', '.join(_AMD_FAMILIES)}."
        )
    return cond


def render_table_patch(root: Path, rules: Sequence[TableRule], arch: Arch, *, note: str = "") -> str | None:
    """``upstream.patch`` for the whole table: a git-format diff of fattn.cu (None for no rules)."""
    new = patched_fattn_table(root, rules, arch, note=note)
    return None if new is None else git_diff(FATTN, (root / FATTN).read_text(), new)


def harness_source(patched: str, kv_types: Sequence[str]) -> str:
    """A host-only C++ program around a patched fattn.cu's lookup, to compare it with :func:`match_table`."""
    enum = re.search(r"^enum best_fattn_kernel \{.*?^\};\n", patched, re.M | re.S)
    start = patched.find(f"struct {_STRUCT} {{")
    fn = patched.find(f"static best_fattn_kernel {LOOKUP_PREFIX}", start)
    end = patched.find("\n}\n", fn)
    if enum is None or start < 0 or fn < 0 or end < 0:
        raise TunerError("The patched fattn.cu has no best_fattn_kernel enum or no sweep table to extract.")
    types = ", ".join(f"{kv_type_enum(t)} = {i}" for i, t in enumerate(kv_types))
    names = " : ".join(f'k == {e} ? "{n}"' for n, e in KERNEL_ENUMS.items())
    return "\n".join(
        [
            "#include <cstdint>",
            "#include <cstdio>",
            f"enum ggml_type {{ {types} }};",
            enum.group(0),
            patched[start : end + 3],
            "int main() {",
            "    long long D, ne1, n_kv;",
            "    int gqa, tk, tv, vec, opt;",
            '    while (std::scanf("%lld %d %d %d %lld %lld %d %d", &D, &gqa, &tk, &tv, &ne1, &n_kv, &vec, &opt) == 8) {',
            f"        const best_fattn_kernel k = {patched[fn + len('static best_fattn_kernel ') : patched.index('(', fn)]}(",
            "            D, gqa, (ggml_type) tk, (ggml_type) tv, ne1, n_kv, vec != 0, opt != 0);",
            f'        std::puts({names} : "NONE");',
            "    }",
            "    return 0;",
            "}",
            "",
        ]
    )
