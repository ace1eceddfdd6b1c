"""Python mirrors of the C++ lookups tuner patches into llama.cpp, for tests only: each test compiles the
rendered C++ on the host and checks it answers as its mirror here does, so the hooks' grammar and matching
are pinned in one readable place. tuner itself never calls these (it renders the C++ and runs it).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from tuner.errors import TunerError, UsageError, close_matches
from tuner.plan.fa_rules import FaRule
from tuner.plan.patch import render_template
from tuner.sweep.mmq import ENV, MMQ_SUPPORTED, MmqChoice

_ENTRY = re.compile(r"([A-Za-z0-9_]+):([0-9]{1,18})\.\.([0-9]{0,18})=(MMQ|BLAS)")
_GRAMMAR = "TYPE:LO..HI=MMQ|BLAS (ne11 in [LO, HI), HI empty = unbounded; e.g. q4_K:1024..=BLAS)"
_MMQ_HOOK_TEMPLATE = "patches/mma/mmq-hook.cu.j2"  # tuner.sweep.mmq's opt-in manifest mmq-hook renders it


def match_rules(
    rules: Sequence[FaRule],
    phase: str,
    n_kv: int,
    D: int,
    gqa: int,
    kv: str,
    *,
    kv_v: str | None = None,
    ne1: int | None = None,
) -> FaRule | None:
    """The rule the patched selector applies to one FlashAttention call, or None for upstream's choice.

    Mirrors ``ggml_cuda_get_best_fattn_kernel`` in ``templates/patches/mma/fattn-tail.cu.j2``: the first
    rule whose phase, n_kv range and shape keys (a key left out matches anything) all match wins. Like
    the C++, a matched rule whose kernel is illegal for the shape is still the match (the hook then
    keeps the default, why="fallback"); legality is not modelled here.

    ``n_kv`` is K->ne[1], ``D`` Q->ne[0], ``gqa`` Q->ne[2] / K->ne[2]; ``kv`` the ggml type name of K (and
    of V unless ``kv_v`` differs; a ``kv`` key needs both to equal it); ``ne1`` the query batch Q->ne[1] of
    a prefill call, which an ``nb`` key must equal (None: unknown, matched by no ``nb`` key).
    """
    v_type = kv if kv_v is None else kv_v
    for r in rules:
        if r.phase != phase or not r.covers(n_kv):
            continue
        if (
            (r.D is not None and r.D != D)
            or (r.gqa is not None and r.gqa != gqa)
            or (r.kv is not None and (r.kv != kv or r.kv != v_type))
            or (r.nb is not None and r.nb != ne1)
        ):
            continue
        return r
    return None


def parse_mmq_choices(text: str) -> tuple[MmqChoice, ...]:
    """``GGML_TUNER_MMQ_CHOICES`` as the hook reads it; UsageError where the hook aborts or a type is not MMQ's."""
    out = []
    for item in text.split(","):
        if not item:
            continue
        m = _ENTRY.fullmatch(item)
        if not m:
            raise UsageError(f"{ENV} entry {item!r} is not {_GRAMMAR}.")
        if m.group(1) not in MMQ_SUPPORTED:
            raise UsageError(
                f"{ENV} entry {item!r}: {m.group(1)!r} is no type MMQ supports ({', '.join(MMQ_SUPPORTED)})."
                f"{close_matches(m.group(1), MMQ_SUPPORTED)}"
            )
        lo, hi = int(m.group(2)), int(m.group(3)) if m.group(3) else None
        if hi is not None and hi <= lo:
            raise UsageError(f"{ENV} entry {item!r}: HI {hi} must be greater than LO {lo}.")
        out.append(MmqChoice(type=m.group(1), lo=lo, hi=hi, backend=m.group(4)))
    return tuple(out)


def match_mmq(choices: Sequence[MmqChoice], type_name: str, ne11: int) -> str | None:
    """The backend the first covering entry names, or None where upstream's choice stays."""
    return next((c.backend for c in choices if c.type == type_name and c.covers(ne11)), None)


def mmq_harness_source(patched: str, type_names: Sequence[str]) -> str:
    """A host-only C++ program around a patched mmq.cu's hook, to compare it with :func:`match_mmq`."""
    # the hook's C++ (parser, table and lookup) as patched_mmq_hook puts it before the function
    start = patched.find(render_template(_MMQ_HOOK_TEMPLATE, {}, what="the MMQ hook").splitlines()[0])
    fn = patched.find("static int ggml_tuner_mmq_choose(", start)
    end = patched.find("\n}\n", fn)
    if start < 0 or fn < 0 or end < 0:
        raise TunerError("The patched mmq.cu has no GGML_TUNER_MMQ_CHOICES hook to extract.")
    enum = ", ".join(f"GGML_TYPE_{t.upper()} = {i}" for i, t in enumerate(type_names))
    names = ", ".join(f'"{t}"' for t in type_names)
    return "\n".join(
        [
            "#include <cstdint>",
            "#include <cstdio>",
            "#include <cstdlib>",
            "#include <string>",
            "#include <vector>",
            f"enum ggml_type {{ {enum}, GGML_TYPE_COUNT }};",
            f"static const char * ggml_type_name(ggml_type t) {{ static const char * n[] = {{{names}}}; return n[t]; }}",
            "#define GGML_ABORT(...) (std::fprintf(stderr, __VA_ARGS__), std::fputc('\\n', stderr), std::exit(3))",
            patched[start : end + 3],
            "int main() {",
            "    int t;",
            "    long long ne11;",
            '    while (std::scanf("%d %lld", &t, &ne11) == 2) {',
            "        const int r = ggml_tuner_mmq_choose((ggml_type) t, ne11);",
            '        std::puts(r == 1 ? "MMQ" : r == 0 ? "BLAS" : "NONE");',
            "    }",
            "    return 0;",
            "}",
            "",
        ]
    )
