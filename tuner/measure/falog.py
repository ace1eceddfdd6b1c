"""The tuner build's own record of its FlashAttention choice: ``GGML_TUNER_FA_LOG=1`` makes the patched
build print one line per distinct shape and kernel
(``tuner-fa: D=64 DV=64 ne1=1 gqa=4 n_kv=33024 kernel=VEC (default)``): ``default`` is upstream's pick,
``rule`` a forced one, ``fallback`` a forced kernel that is illegal there (upstream's choice kept).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

# The hook may print more fields between n_kv and kernel (type_k=f16 type_v=f16 since rules carry the K/V type).
_FA_LINE = re.compile(
    r"tuner-fa: D=(\d+) DV=(\d+) ne1=(\d+) gqa=(\d+) n_kv=(\d+)((?: [a-z_]+=\S+)*?) kernel=(\w+) \((\w+)\)"
)
_FIELD = re.compile(r" ([a-z_]+)=(\S+)")


def parse_fa_log(text: str) -> list[dict[str, Any]]:
    """The ``tuner-fa:`` lines of a llama-bench log; ``type_k`` and ``type_v`` are None where the line has
    none (a build from before the hook printed them)."""
    out = []
    for m in _FA_LINE.finditer(text):
        extra = dict(_FIELD.findall(m.group(6)))
        sizes = dict(zip(("D", "DV", "ne1", "gqa", "n_kv"), map(int, m.groups()[:5])))
        types = {"type_k": extra.get("type_k"), "type_v": extra.get("type_v")}
        out.append(sizes | types | {"kernel": m.group(7), "why": m.group(8)})
    return out


def kernel_at(lines: Sequence[Mapping[str, Any]], phase: str, depth: int, ntok: int) -> tuple[str | None, str | None]:
    """(kernel, why) of the test at ``depth``: entries of the phase's batch shape whose n_kv lies in
    (depth, depth + ntok + 256] (llama.cpp pads n_kv to 256; the untimed depth fill stays at or below
    ``depth``). A prompt shorter than the micro-batch (``pp2`` after a depth) attends at ``Q->ne[1] = ntok``,
    but the scheduler's graph reservation at the full micro-batch logs a line at the same n_kv: where a line
    has the test's own batch, only those count."""
    hits = [x for x in lines if (x["ne1"] == 1) == (phase == "tg") and depth < x["n_kv"] <= depth + ntok + 256]
    own = [x for x in hits if phase == "pp" and x["ne1"] == ntok]
    hits = own or hits
    if not hits:
        return None, None
    best = max(hits, key=lambda x: x["n_kv"])
    return str(best["kernel"]), str(best["why"])
