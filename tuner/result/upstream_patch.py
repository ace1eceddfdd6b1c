"""An upstream-ready export: the confirmed FA rules as plain conditions in upstream's own
``ggml_cuda_get_best_fattn_kernel`` (``ggml/src/ggml-cuda/fattn.cu``), as ``upstream.patch`` (a minimal diff
against the pristine tree, unlike ``tuned.patch``'s whole hook) and ``PR.md`` (a compare-llama-bench-shaped
table). Pure: text in, text out. Choices (docs/selector.md walks through the function):

* **GPUs:** ``cc ==`` the measured compute capability (ggml's ``100*major + 10*minor``; sm_90 is exactly
  ``GGML_CUDA_CC_HOPPER``). A range up to the next ``common.cuh`` constant would cover Blackwell's cc 1000
  and 1100, never measured, and kernel choice differs between minor versions; without a constant the literal
  is used, as upstream does (``!= 610``). AMD: ``GGML_CUDA_CC_OFFSET_AMD + 0x<gfx id>`` (``ggml_cuda_parse_id``).
* **``cc``, not ``ggml_cuda_highest_compiled_arch(cc)``:** upstream keys policy on ``cc`` and availability on
  the compiled arch. For NVIDIA >= Turing the block goes at the top of upstream's ``turing_mma_available(cc)``
  branch, so a forced MMA has device code; elsewhere just before it, with its own availability check. A
  ``--ptx-jit`` result is keyed to its target arch, which the PR body notes.
* **Legality:** after upstream's head-size, K/V-type and mask gates; VEC also needs ``can_use_vector_kernel``;
  a kernel never legal for its head size (VEC D=192, MMA D=40/72) is refused; MMA and TILE rules at GQA >= 2
  need ``gqa_opt_applies`` (measured with the GQA-packed kernels).
* **Phase:** ``Q->ne[1] == 1`` decode, ``> 1`` prefill; n_kv is ``K->ne[1]`` (``lo`` inclusive, ``hi`` exclusive).
* **Order:** the hook applies the first matching rule; plain ``if`` blocks would fall through, so
  overlapping rules are refused (confirmed rules do not overlap).

The diff is git's format from :mod:`difflib`, hunk headers naming the enclosing function, so ``git apply`` takes it.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import math
import os
import re
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tuner.errors import TunerError
from tuner.plan.fa_rules import KERNEL_ENUMS, FaRule, Phase
from tuner.result.tables import compare_table, method_paragraph
from tuner.source.spec import Source
from tuner.targets.archs import Arch

Tree = str | os.PathLike[str] | Source
"""A pristine llama.cpp tree: its path, or the ``Source`` whose ``.root`` it is."""

FATTN = "ggml/src/ggml-cuda/fattn.cu"
COMMON = "ggml/src/ggml-cuda/common.cuh"
FUNCTION = "ggml_cuda_get_best_fattn_kernel"

# ggml_cuda_fattn_kv_type_supported() in fattn.cu; any other type is BEST_FATTN_KERNEL_NONE upstream.
_KV_TYPES = {t: t.upper() for t in ("f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0")}


def kv_type_enum(kv: str) -> str:
    """The ``GGML_TYPE_*`` enumerator of a FlashAttention K/V type name (``f16`` -> ``GGML_TYPE_F16``); TunerError
    for a type upstream's FlashAttention does not support."""
    if kv.lower() not in _KV_TYPES:
        raise TunerError(_unsupported_kv(kv))
    return f"GGML_TYPE_{_KV_TYPES[kv.lower()]}"


def _unsupported_kv(kv: str) -> str:
    return f"K/V type {kv!r} has no FlashAttention support upstream (supported: {', '.join(_KV_TYPES)})."


# Anchors in the pristine function (fattn.cu L541-720 of llama.cpp 0c1e570, docs/selector.md).
_TURING_BRANCH = "    if (turing_mma_available(cc) && Q->ne[0] != 40 && Q->ne[0] != 72) {\n"
_TURING_COMMENT = "    // If Turing tensor cores are available, use them:\n"
_NEEDS = ("const int gqa_ratio", "bool gqa_opt_applies", "const bool can_use_vector_kernel", "const int cc")
_WIDTH = 120


def _root(source_root: Tree) -> Path:
    """A tree path, or a ``Source``'s ``.root`` (a ``Path`` has a ``.root`` too: the anchor, not the tree)."""
    if isinstance(source_root, (str, os.PathLike)):
        return Path(source_root)
    return Path(source_root.root)


# ---------------------------------------------------------------------------------------------- arch


def _cc_constants(common_text: str) -> tuple[dict[int, str], dict[int, str]]:
    """NVIDIA value -> name and AMD gfx id -> name of the ``GGML_CUDA_CC_*`` constants in common.cuh."""
    nv = {int(v): n for n, v in re.findall(r"^#define\s+(GGML_CUDA_CC_[A-Z0-9_]+)\s+(\d+)\b", common_text, re.M)}
    amd = {
        int(v, 16): n
        for n, v in re.findall(
            r"^#define\s+(GGML_CUDA_CC_[A-Z0-9_]+)\s+\(GGML_CUDA_CC_OFFSET_AMD \+ 0x([0-9a-fA-F]+)\)", common_text, re.M
        )
    }
    return nv, amd


def arch_condition(arch: Arch, common_text: str) -> str:
    """The C++ condition on ``cc`` that selects exactly the arch a rule was measured on (module doc); TunerError
    for a CPU arch, or an arch without a cc / gfx id."""
    nv, amd = _cc_constants(common_text)
    if arch.vendor == "nvidia" and arch.cc:
        return f"cc == {nv.get(arch.cc, str(arch.cc))}"
    if arch.vendor == "amd" and arch.gfx and re.fullmatch(r"gfx[0-9a-fA-F]{3,4}", arch.gfx):
        gid = int(arch.gfx[3:], 16)
        return f"cc == {amd[gid]}" if gid in amd else f"cc == GGML_CUDA_CC_OFFSET_AMD + 0x{arch.gfx[3:].lower()}"
    raise TunerError(
        f"An upstream patch changes the CUDA/HIP FlashAttention selection; arch {arch.name!r} "
        f"({arch.vendor}) has none. Export upstream.patch only for NVIDIA or AMD results."
    )


def _in_turing_branch(arch: Arch) -> bool:
    return arch.vendor == "nvidia" and (arch.cc or 0) >= 750


def _mma_available(arch: Arch) -> str | None:
    """Upstream's own check that MMA has device code, for a block placed before the Turing branch."""
    math_ = getattr(arch, "math", {}) or {}
    if arch.vendor == "nvidia":
        return "volta_mma_available(cc)" if (arch.cc or 0) >= 700 else None
    if math_.get("fp16_mfma"):
        return "amd_mfma_available(cc)"
    if math_.get("fp16_wmma"):
        # the WMMA path of the MMA kernel needs ncols2 > 1 (fattn.cu: amd_wmma_available && gqa_opt_applies)
        return "amd_wmma_available(cc) && gqa_opt_applies"
    return None


# --------------------------------------------------------------------------------------------- rules


def _check_rule(rule: FaRule, arch: Arch) -> None:
    D, gqa, kv = rule.D, rule.gqa, rule.kv
    where = f"rule {rule.text}"
    if rule.kernel not in KERNEL_ENUMS:
        raise TunerError(f"{where}: kernel must be one of {sorted(KERNEL_ENUMS)}.")
    if rule.lo < 0 or (rule.hi is not None and rule.hi <= rule.lo):
        raise TunerError(f"{where}: n_kv range must satisfy 0 <= lo < hi.")
    if kv is not None and kv.lower() not in _KV_TYPES:
        raise TunerError(f"{where}: {_unsupported_kv(kv)}")
    if gqa is not None and gqa < 1:
        raise TunerError(f"{where}: the GQA ratio must be >= 1.")
    if rule.nb is not None and (type(rule.nb) is not int or rule.nb < 2):
        raise TunerError(f"{where}: a query batch key (nb) must be an integer >= 2.")
    if D is not None and rule.kernel == "VEC" and not (D <= 256 and D % 64 == 0 and D != 192):
        raise TunerError(f"{where}: no vector kernel exists for head size {D} (can_use_vector_kernel is false).")
    if rule.kernel == "MMA":
        if D in (40, 72):
            raise TunerError(f"{where}: upstream has no MMA kernel for head size {D}.")
        avail = None if _in_turing_branch(arch) else _mma_available(arch)
        if not _in_turing_branch(arch) and avail is None:
            raise TunerError(f"{where}: {arch.name} has no MMA FlashAttention kernel upstream.")
        if avail and "amd_wmma" in avail and D is not None and D > 256:
            raise TunerError(f"{where}: the AMD WMMA path of the MMA kernel needs head size <= 256.")


def _overlap(a: FaRule, b: FaRule) -> bool:
    if a.phase != b.phase:
        return False
    for x, y in ((a.D, b.D), (a.gqa, b.gqa), (a.kv, b.kv), (a.nb, b.nb)):
        if x is not None and y is not None and str(x).lower() != str(y).lower():
            return False
    a_hi = math.inf if a.hi is None else a.hi
    b_hi = math.inf if b.hi is None else b.hi
    return a.lo < b_hi and b.lo < a_hi


def rule_condition(rule: FaRule, arch: Arch) -> list[str]:
    """The C++ conjuncts of one rule, in reading order: phase, shape, n_kv range, legality. The one place a rule
    becomes C++ in upstream's own selection function; ``tuned.patch``'s hook reads rules as data instead."""
    D, gqa, kv = rule.D, rule.gqa, rule.kv
    if rule.phase is Phase.DECODE:
        parts = ["Q->ne[1] == 1"]
    else:
        parts = ["Q->ne[1] > 1" if rule.nb is None else f"Q->ne[1] == {int(rule.nb)}"]
    if D is not None:
        parts.append(f"Q->ne[0] == {D}")
    if gqa is not None:
        parts.append(f"gqa_ratio == {gqa}")
    if kv is not None:
        t = kv_type_enum(kv)
        parts += [f"K->type == {t}", f"V->type == {t}"]
    if rule.lo > 0:
        parts.append(f"K->ne[1] >= {rule.lo}")
    if rule.hi is not None:
        parts.append(f"K->ne[1] < {rule.hi}")
    if rule.kernel == "VEC":
        parts.append("can_use_vector_kernel")
    elif rule.kernel == "MMA" and not _in_turing_branch(arch):
        avail = str(_mma_available(arch))
        parts.append(avail)
        if D is None:  # the head sizes upstream keeps off the MMA kernel on this path
            parts += ["Q->ne[0] != 40", "Q->ne[0] != 72"] + (["Q->ne[0] <= 256"] if "amd_wmma" in avail else [])
    if rule.kernel in ("MMA", "TILE") and gqa is not None and gqa >= 2 and "gqa_opt_applies" not in " ".join(parts):
        parts.append("gqa_opt_applies")
    return parts


def _if_lines(parts: Sequence[str], indent: int) -> list[str]:
    """``if (a && b ...) {`` wrapped at _WIDTH in upstream's style (continuation 8 spaces deeper)."""
    pieces = [p + " &&" for p in parts[:-1]] + [parts[-1] + ") {"]
    lines, cur = [], " " * indent + "if (" + pieces[0]
    for piece in pieces[1:]:
        if len(cur) + 1 + len(piece) > _WIDTH:
            lines.append(cur)
            cur = " " * (indent + 8) + piece
        else:
            cur += " " + piece
    return lines + [cur]


def _comment(note: str, indent: int) -> list[str]:
    pad, width = " " * indent, _WIDTH - indent - 3
    paras = [p.strip() for p in note.strip().splitlines() or [""]]  # an empty paragraph is a bare "//"
    lines = [ln for p in paras for ln in textwrap.wrap(p, width, break_on_hyphens=False) or [""]]
    return [f"{pad}// {ln}" if ln else f"{pad}//" for ln in lines]


def _block(rules: Sequence[FaRule], arch: Arch, cond: str, note: str, indent: int) -> list[str]:
    pad = " " * indent
    out = _comment(note or f"Kernel choice measured on {arch.name}.", indent)
    out.append(f"{pad}if ({cond}) {{")
    for r in rules:
        out += _if_lines(rule_condition(r, arch), indent + 4)
        out += [f"{pad}        return {KERNEL_ENUMS[r.kernel]};", f"{pad}    }}"]
    out += [f"{pad}}}", ""]
    return [ln + "\n" if ln else "\n" for ln in out]


def patched_fattn(source_root: Tree, rules: Sequence[FaRule], arch: Arch, *, note: str = "") -> str | None:
    """fattn.cu of the pristine tree with the rules added to its selection function; None for no rules. TunerError
    where the tree's selection function has another structure, or a rule cannot be expressed legally (module doc)."""
    rules = list(rules)
    if not rules:
        return None
    root = _root(source_root)
    if arch.vendor not in ("nvidia", "amd"):
        arch_condition(arch, "")  # raises: no CUDA/HIP selection to change
    for r in rules:
        _check_rule(r, arch)
    for a, b in itertools.combinations(rules, 2):
        if _overlap(a, b):
            raise TunerError(
                f"Rules {a!r} and {b!r} overlap; upstream.patch encodes each rule as its own condition, which "
                "equals the tuner hook's first-match semantics only for disjoint rules. Merge or split them."
            )
    path, common = root / FATTN, root / COMMON
    if not path.is_file() or not common.is_file():
        raise TunerError(f"{root} has no {FATTN} and {COMMON}; upstream.patch needs the pristine llama.cpp tree.")
    text = path.read_text()
    cond = arch_condition(arch, common.read_text())
    start = text.find(f"static best_fattn_kernel {FUNCTION}(")
    end = text.find("\n}\n", start)
    body = text[start:end] if start >= 0 and end >= 0 else ""
    missing = [n for n in _NEEDS if n not in body]
    anchor = _TURING_BRANCH if _in_turing_branch(arch) else _TURING_COMMENT
    if missing or anchor not in body:
        raise TunerError(
            f"{FATTN} of {root}: {FUNCTION} does not have the structure upstream.patch is written for "
            f"(missing {', '.join(missing) or repr(anchor.strip())}); this tree's selection function differs "
            "from llama.cpp 0c1e570 (docs/selector.md). Use tuned.patch for this tree."
        )
    lines = text.splitlines(keepends=True)
    first = text[:start].count("\n")
    at = next(i for i in range(first, len(lines)) if lines[i] == anchor)
    if _in_turing_branch(arch):
        new = lines[: at + 1] + _block(rules, arch, cond, note, 8) + lines[at + 1 :]
    else:
        new = lines[:at] + _block(rules, arch, cond, note, 4) + lines[at:]
    return "".join(new)


def _funcname(lines: Sequence[str], before: int) -> str:
    """Git's default hunk-header context: the last line before ``before`` starting with [A-Za-z_$]."""
    for i in range(min(before, len(lines)) - 1, -1, -1):
        if re.match(r"[A-Za-z_$]", lines[i]):
            return lines[i].rstrip()[:80]
    return ""


def _blob(text: str) -> str:
    """Git's blob id of ``text`` (the ``index`` line lets ``git apply -3`` fall back to a 3-way merge)."""
    data = text.encode()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def render_upstream_patch(source_root: Tree, rules: Sequence[FaRule], arch: Arch, *, note: str = "") -> str | None:
    """``upstream.patch``: a git-format diff of the pristine tree's fattn.cu adding ``rules`` (in order) for ``arch``,
    ``note`` (GPU, model, how measured) as a comment above them; None for no rules; TunerError as ``patched_fattn``."""
    new = patched_fattn(source_root, rules, arch, note=note)
    if new is None:
        return None
    return git_diff(FATTN, (_root(source_root) / FATTN).read_text(), new)


def git_diff(path: str, old: str, new: str) -> str:
    """A git-format unified diff of one file ``path`` (relative to the tree) from ``old`` to ``new``, hunk
    headers carrying the enclosing function as git prints it; '' when the texts are equal."""
    if old == new:
        return ""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    out = [f"diff --git a/{path} b/{path}\n", f"index {_blob(old)[:7]}..{_blob(new)[:7]} 100644\n"]
    for ln in difflib.unified_diff(a, b, f"a/{path}", f"b/{path}", n=3):
        if m := re.match(r"@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@", ln):
            fn = _funcname(a, int(m.group(1)) - 1)
            ln = ln.rstrip("\n") + (f" {fn}" if fn else "") + "\n"
        out.append(ln)
    return "".join(out)


def whitespace_only_hunks(patch: str) -> list[str]:
    """The ``@@`` headers (with file) of hunks whose changes are whitespace only, e.g. added blank lines."""
    bad: list[str] = []
    file, header = "", None
    minus: list[str] = []
    plus: list[str] = []

    def flush() -> None:
        if header is not None and (minus or plus):
            if "".join(minus).split() == "".join(plus).split():
                bad.append(f"{file} {header}")

    for ln in patch.splitlines():
        if ln.startswith("diff --git ") or ln.startswith("--- "):
            flush()
            header, minus, plus = None, [], []
            continue
        if ln.startswith("+++ "):
            file = ln[4:].strip().removeprefix("b/")
            continue
        if ln.startswith("@@"):
            flush()
            header, minus, plus = ln.split("@@")[1].strip(), [], []
        elif header is not None and ln.startswith("-"):
            minus.append(ln[1:] + "\n")
        elif header is not None and ln.startswith("+"):
            plus.append(ln[1:] + "\n")
    flush()
    return bad


# ------------------------------------------------------------------------------------------- PR body


def _shape(rule: FaRule) -> str:
    D, gqa, kv = rule.D, rule.gqa, rule.kv
    bits = [
        f"head size {D}" if D is not None else "any head size",
        f"GQA ratio {gqa}" if gqa is not None else "any GQA ratio",
        f"K/V {kv}" if kv is not None else "any K/V type",
    ]
    return ", ".join(bits)


def _range(rule: FaRule) -> str:
    if rule.hi is None:
        return f"n_kv >= {rule.lo}" if rule.lo else "any n_kv"
    return f"{rule.lo} <= n_kv < {rule.hi}" if rule.lo else f"n_kv < {rule.hi}"


def models_note(*, model_file: str, shape: Mapping[str, object], like: str | None, synthetic: bool | None) -> str:
    """The PR's "Models" section: where the shapes came from, what the weights were, and what that shows."""
    dims = ", ".join(
        f"{k.replace('_', ' ')} {shape[k]}"
        for k in ("head_dim", "gqa", "n_layers", "n_heads", "n_kv_heads")
        if shape.get(k) is not None
    )
    d = f" ({dims})" if dims else ""
    src = (
        f"the shapes of `{like}`{d}, as tuner's `tuner/data/models.toml` records them from the model's published "
        "config.json"
        if like
        else f"the shapes of the measured file `{model_file}`{d}"
    )
    if synthetic:
        weights = (
            f"**synthetic random weights**: `tuner model synth --like {like or '?'}` wrote a GGUF with exactly these "
            "tensors and hyperparameters, filled with random numbers."
        )
    elif synthetic is False:
        weights = f"the weights of `{model_file}` (a real model file)."
    else:
        weights = (
            f"not recorded: the study kept only the file name `{model_file}`, not whether its weights were real "
            "or random."
        )
    return "\n".join(
        [
            f"Model: {src}. Weights: " + weights,
            "",
            "What this shows: the FlashAttention kernel's speed at these shapes (head size, GQA ratio, K/V type) and "
            "context depths; attention cost does not depend on the weights' values, so random weights time the same "
            "kernels a real model of this shape runs. What it does not show: output quality (random weights produce "
            "no meaningful text; the kernels' outputs were checked against upstream's with llama-perplexity's KL "
            "divergence, not against a task), other models' shapes, or other GPUs of the same compute capability.",
            "",
        ]
    )


def reproduce_commands(
    *,
    commit: str | None,
    arch: Arch,
    defines: Mapping[str, str],
    model_file: str,
    like: str | None,
    quant: str | None,
    depths: Sequence[int],
    pp: int,
    tg: int,
    phases: Sequence[str],
    search_depths: Sequence[int] = (),
    search_args: Sequence[str] = (),
) -> list[str]:
    """Stock llama.cpp at ``commit``, built as is and with ``upstream.patch``; plain llama-bench runs of both
    and an A/A run; ``tuner compare``; then the tuner search and export. Relative paths only, no tuner-only
    environment variables: the patch alone changes the kernel choice."""
    ds = ",".join(str(d) for d in sorted(set(depths)))
    flags = " ".join(f"-D{k}={v}" for k, v in sorted(defines.items()) if not k.startswith("CMAKE_BUILD_RPATH"))
    p = pp if "pp" in phases else 0
    n = tg if "tg" in phases else 0
    model = "model.gguf"
    targets = "llama-bench" + (" llama-quantize" if quant else "")
    out = [
        "# from the folder holding upstream.patch: llama.cpp at the commit it was measured against, A as is, B patched",
        "git clone https://github.com/ggml-org/llama.cpp && cd llama.cpp"
        + (f" && git checkout {commit}" if commit else ""),
        f"cmake -B build-a {flags} && cmake --build build-a -j --target {targets}",
        "git apply ../upstream.patch",
        f"cmake -B build-b {flags} && cmake --build build-b -j --target llama-bench",
    ]
    if like:
        out += [
            "# the model: random weights with the measured shapes (see Models; needs tuner: pip install -e . in its repository)",
            f"tuner model synth --like {like}"
            + (f" --quant {quant} --quantize-with build-a/bin/llama-quantize" if quant else "")
            + f" -o {model}",
        ]
    else:
        out += [f"# the model: the measured file {model_file} (see Models), copied or linked here as {model}"]
    bench = f"-m {model} -fa 1 -p {p} -n {n} -d {ds} -r 10 -o jsonl"
    out += [
        "# A, B, and A again: the A/A pair is this machine's own noise",
        f"build-a/bin/llama-bench {bench} > a.jsonl",
        f"build-b/bin/llama-bench {bench} > b.jsonl",
        f"build-a/bin/llama-bench {bench} > a2.jsonl",
        "tuner compare a.jsonl b.jsonl --aa a.jsonl a2.jsonl",
        "# the search that found it, and its export (from tuner's repository)",
        f"tuner search --arch {arch.name}"
        + (f" --like {like}" if like else f" --model {model}")
        + (f" --quant {quant}" if quant and like else "")
        + f" --depths {','.join(str(d) for d in sorted(set(search_depths or depths)))}"
        + "".join(f" {x}" for x in search_args),
        "tuner export --study STUDY -o result   # STUDY: the name tuner search prints",
    ]
    return out


def render_pr_body(
    rules: Sequence[FaRule],
    arch: Arch,
    *,
    gpu: str,
    model: str,
    points: Sequence[Mapping[str, Any]],
    commands: Sequence[str],
    source: str = "",
    rounds: Sequence[int] | int | None = None,
    models: str = "",
    noise_ceiling_pct: float | None = None,
) -> str:
    """``PR.md``: a pull-request body for ``upstream.patch``. ``points``: one dict per measured point, as
    :func:`tuner.result.tables.compare_records` reads them (a ``rule`` of ``sequential`` puts the search's
    decision rule in the method paragraph); ``commands``: :func:`reproduce_commands`, verbatim; ``rounds``:
    paired rounds per point (default: the points' ``rounds``); ``models``: :func:`models_note`;
    ``noise_ceiling_pct``: the A/A noise above which a phase claims nothing."""
    name = arch.name
    kernels = sorted({r.kernel for r in rules})
    title = (
        f"CUDA: FlashAttention kernel selection for {gpu} ({name})"
        if len(kernels) != 1
        else f"CUDA: use the {kernels[0]} FlashAttention kernel on {gpu} ({name}) where it is faster"
    )
    what = (
        f"`ggml_cuda_get_best_fattn_kernel` (`{FATTN}`) gets {len(rules)} condition(s) for {name} "
        f"(`{'cc == ' + str(arch.cc) if arch.cc else arch.gfx}`) only; every other GPU keeps upstream's "
        "choice. The conditions sit after the head-size, K/V-type and mask checks and use upstream's own "
        "legality checks, so they never pick a kernel that has no code for the shape."
    )
    out = [f"# {title}", "", "## What changes", "", what, ""]
    for r in rules:
        covered = [p for p in points if str(p.get("phase")) in (r.phase.bench, r.phase.value)]
        ups = {
            str(p["upstream_kernel"]) for p in covered if r.covers(int(p.get("depth", -1))) and p.get("upstream_kernel")
        }
        was = "/".join(sorted(ups)) or "upstream's default"
        out.append(f"- {r.phase}, {_shape(r)}, {_range(r)}: **{r.kernel}** (upstream: {was})")
    gpu_line = f"GPU: {gpu} ({name}). Model: {model}." + (f" Against {source}." if source else "")
    out += ["", "## Performance", "", gpu_line, ""]
    out += [compare_table(points, name_a="upstream", name_b="patched", model=model), ""]
    rs = [rounds] if isinstance(rounds, int) else list(rounds or [int(p.get("rounds") or 0) for p in points])
    noise = [float(p["aa_noise_pct"]) for p in points if p.get("aa_noise_pct") is not None]
    out += [
        "## How it was measured",
        "",
        method_paragraph(
            "paired rounds",
            rounds=rs,
            ceiling_pct=noise_ceiling_pct,
            rule="sequential" if any(p.get("rule") == "sequential" for p in points) else None,
            noise=(
                "the A/A pair (upstream measured against itself in the same rounds), at least the phase's median A/A "
                "noise" + (f"; {min(noise):.1f}–{max(noise):.1f}% here." if noise else ".")
            ),
        ),
        "",
    ]
    if models.strip():
        out += ["## Models", "", models.strip(), ""]
    out += ["## Reproduce", "", "```sh", *commands, "```", ""]
    return "\n".join(out)
