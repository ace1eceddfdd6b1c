"""FlashAttention selection rules: the one typed form, its text and its parser.

A rule is a :class:`FaRule` from the search's compose stage to the export. It becomes text only at
the edges, and only through this module:

* :func:`rules_env`: the ``GGML_TUNER_FA_RULES`` value the C++ hook reads (``templates/patches/mma``);
* :func:`rules_texts` / :func:`rules_from_texts`: the ``list[str]`` a study's user attributes and an
  export's ``config.toml`` hold (their JSON and TOML stay as they always were, so old studies load);
* :func:`parse_fa_rules`: user input (``tuner ab --rules``, ``baked_runtime``), checked like the hook.

The C++ condition of a rule in upstream's own selection function is
:func:`tuner.result.upstream_patch.rule_condition`.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tuner.errors import UsageError, close_matches


class Phase(str, enum.Enum):
    """The phase a rule acts in: ``decode`` (Q->ne[1] == 1) or ``prefill`` (Q->ne[1] > 1).

    The search and llama-bench call them ``tg`` and ``pp`` (:attr:`bench`, :meth:`from_bench`)."""

    DECODE = "decode"
    PREFILL = "prefill"

    def __str__(self) -> str:
        return self.value

    @property
    def bench(self) -> str:
        """llama-bench's test name for the phase: ``tg`` (decode) or ``pp`` (prefill)."""
        return "tg" if self is Phase.DECODE else "pp"

    @classmethod
    def from_bench(cls, name: str) -> Phase:
        """The phase of llama-bench's ``tg``/``pp``."""
        for p in cls:
            if p.bench == name:
                return p
        raise ValueError(f"not a llama-bench phase: {name!r} (tg or pp)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class FaRule:
    """One ``PHASE[/KEY...]:lo-hi=KERNEL`` entry of GGML_TUNER_FA_RULES (n_kv in [lo, hi); hi None = unbounded).

    The optional shape keys restrict the rule to one attention shape; ``None`` matches any shape, so a
    rule without keys applies to every FlashAttention call (the grammar before shape keys existed).
    """

    phase: Phase
    lo: int
    hi: int | None
    kernel: str
    D: int | None = None
    """Head size of K (``Q->ne[0]``); key ``D<int>``."""
    gqa: int | None = None
    """GQA ratio (``Q->ne[2] / K->ne[2]``); key ``gqa<int>``."""
    kv: str | None = None
    """ggml type name that both K and V must have (``f16``, ``q8_0``...); key ``kv<type>``."""
    nb: int | None = None
    """Query batch ``Q->ne[1]`` exactly, for prefill rules only (2 and up; decode is 1); key ``nb<int>``.
    Small batches (speculative decoding, parallel sequences) take other kernels than a prompt's, so a
    rule measured at one must not fire at the other."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "phase", Phase(self.phase))  # "decode" and Phase.DECODE are one rule
        if self.nb is not None and self.phase is Phase.DECODE:
            raise ValueError(f"{self.text}: a decode rule has Q->ne[1] = 1; the nb key is for prefill rules")

    @property
    def key(self) -> str:
        """The shape keys as written in a rule (``/D64/gqa4/kvf16``; '' for an unkeyed rule)."""
        keys = (("D", self.D), ("gqa", self.gqa), ("kv", self.kv), ("nb", self.nb))
        return "".join(f"/{name}{v}" for name, v in keys if v is not None)

    @property
    def text(self) -> str:
        """The rule as GGML_TUNER_FA_RULES spells it (keys in the order D, gqa, kv, nb)."""
        return f"{self.phase.value}{self.key}:{self.lo}-{'' if self.hi is None else self.hi}={self.kernel}"

    def __str__(self) -> str:
        return self.text

    def covers(self, n_kv: int) -> bool:
        """Whether ``n_kv`` (a depth) lies in the rule's interval ``[lo, hi)``."""
        return self.lo <= n_kv and (self.hi is None or n_kv < self.hi)

    def starting_at(self, lo: int) -> FaRule:
        """The same rule from n_kv ``lo`` on (its ``hi`` kept); ``lo`` must lie below ``hi``."""
        if self.hi is not None and lo >= self.hi:
            raise ValueError(f"{self.text}: a lower bound {lo} is not below its hi {self.hi}")
        return dataclasses.replace(self, lo=lo)

    def widened(self) -> FaRule:
        """The same rule for every n_kv (``lo`` 0, no ``hi``)."""
        return dataclasses.replace(self, lo=0, hi=None)


# ASCII digits only: the C++ hook reads them with strtoll (Python's \d would take other scripts' digits).
_RULE = re.compile(r"(decode|prefill)((?:/[^/:]*)*):([0-9]+)-([0-9]*)=(VEC|TILE|MMA)")
FA_RULES_MAX = 32
"""Entries the C++ hook holds (GGML_TUNER_FA_MAX_RULES in the patch template); more abort llama.cpp."""

FA_RULE_KV_TYPES: tuple[str, ...] = ("f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl")
"""K/V type names a ``kv<type>`` key may name (as ``ggml_type_name`` spells them; FlashAttention K/V types)."""

FA_RULE_KEY_RANGES: dict[str, tuple[int, int]] = {"D": (1, 4096), "gqa": (1, 256), "nb": (2, 65536)}

KERNEL_ENUMS = {"VEC": "BEST_FATTN_KERNEL_VEC", "TILE": "BEST_FATTN_KERNEL_TILE", "MMA": "BEST_FATTN_KERNEL_MMA_F16"}
"""The ``best_fattn_kernel`` enumerator (fattn.cu) of each kernel name a rule may force."""

_RULE_GRAMMAR = (
    "PHASE[/KEY...]:LO-HI=KERNEL (PHASE decode|prefill; optional shape keys D<head size> (1..4096), "
    "gqa<GQA ratio> (1..256), kv<K/V type> (" + "|".join(FA_RULE_KV_TYPES) + "), nb<query batch Q->ne[1]> "
    "(2..65536, prefill only), each at most once, a missing "
    "key matching any shape; LO-HI an n_kv range, HI may be empty = unbounded; KERNEL VEC|TILE|MMA), "
    "e.g. 'decode:8192-=MMA', 'decode/D64/gqa4/kvf16:32768-=MMA' or 'prefill/D128/gqa4/kvf16/nb4:16384-=TILE'"
)


def _parse_rule_keys(item: str, keys: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in keys.split("/")[1:]:
        m = re.fullmatch(r"(D|gqa|nb)([0-9]+)|kv([a-z0-9_]+)", key)
        if not m:
            raise UsageError(
                f"FA rule {item!r}: shape key {key!r} is not D<int>, gqa<int>, kv<type> or nb<int>. "
                f"Rules are {_RULE_GRAMMAR}."
            )
        name = m.group(1) or "kv"
        if name in out:
            msg = f"FA rule {item!r}: shape key {name} is given twice; give each of D, gqa, kv, nb at most once."
            raise UsageError(msg)
        if name == "kv":
            if m.group(3) not in FA_RULE_KV_TYPES:
                raise UsageError(
                    f"FA rule {item!r}: K/V type {m.group(3)!r} is not one of {', '.join(FA_RULE_KV_TYPES)} "
                    f"(ggml type names, e.g. kvf16, kvq8_0).{close_matches(m.group(3), FA_RULE_KV_TYPES)}"
                )
            out["kv"] = m.group(3)
        else:
            lo, hi = FA_RULE_KEY_RANGES[name]
            v = int(m.group(2))
            if not lo <= v <= hi:
                msg = f"FA rule {item!r}: {name}{m.group(2)} is out of range; {name} must be in [{lo}, {hi}]."
                raise UsageError(msg)
            out[name] = v
    return out


def parse_fa_rules(text: str) -> tuple[FaRule, ...]:
    """Parse a GGML_TUNER_FA_RULES string (the same grammar the C++ hook accepts).

    Grammar: comma-separated ``PHASE[/KEY...]:LO-HI=KERNEL`` with keys ``D<int>``, ``gqa<int>``,
    ``kv<type>`` and (prefill only) ``nb<int>`` in any order (``FaRule.text`` writes them as D, gqa, kv, nb),
    e.g. ``decode/D64/gqa4/kvf16:32768-=MMA``. The C++ parser accepts any ggml type name after ``kv``; this
    one only the FlashAttention K/V types in :data:`FA_RULE_KV_TYPES`. UsageError for an entry that does
    not parse, a bad shape key or an out-of-range value.
    """
    out = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        m = _RULE.fullmatch(item)
        if not m:
            raise UsageError(f"FA rule {item!r} is not phase:lo-hi=KERNEL; rules are {_RULE_GRAMMAR}.")
        keys = _parse_rule_keys(item, m.group(2))
        if "nb" in keys and m.group(1) == "decode":
            raise UsageError(
                f"FA rule {item!r}: a decode rule runs at Q->ne[1] = 1; the nb key (a query batch of 2 or more) "
                "belongs on a prefill rule, e.g. 'prefill/D128/gqa4/kvf16/nb4:16384-=TILE'."
            )
        lo, hi = int(m.group(3)), int(m.group(4)) if m.group(4) else None
        if hi is not None and hi <= lo:
            raise UsageError(f"FA rule {item!r}: hi {hi} must be greater than lo {lo}.")
        if lo > 2**62 or (hi or 0) > 2**62:
            raise UsageError(f"FA rule {item!r}: bound out of range.")
        out.append(FaRule(phase=Phase(m.group(1)), lo=lo, hi=hi, kernel=m.group(5), **keys))
    return _at_most_max(out)


def _at_most_max(rules: Sequence[FaRule]) -> tuple[FaRule, ...]:
    if len(rules) > FA_RULES_MAX:
        msg = f"{len(rules)} FA rules; the llama.cpp hook holds at most {FA_RULES_MAX}. Merge adjacent ranges."
        raise UsageError(msg)
    return tuple(rules)


def rules_env(rules: Iterable[FaRule]) -> str:
    """The GGML_TUNER_FA_RULES value for ``rules``: each rule's :attr:`FaRule.text`, comma-joined, no spaces
    (the C++ hook does not strip them: ``' prefill'`` is no phase there)."""
    return ",".join(r.text for r in rules)


def rules_texts(rules: Iterable[FaRule]) -> list[str]:
    """The rules as a study's user attributes and an export's ``config.toml`` store them: one text each."""
    return [r.text for r in rules]


def rules_from_texts(texts: Iterable[str]) -> tuple[FaRule, ...]:
    """The rules of a stored ``list[str]`` (:func:`rules_texts`: a study's ``result``, ``config.toml``'s
    ``fa_rules``), parsed and checked as :func:`parse_fa_rules` checks user input."""
    return _at_most_max([r for t in texts for r in parse_fa_rules(t)])


def as_stored(value: Any) -> Any:
    """``value`` (JSON-like: mappings, lists, tuples) with each :class:`FaRule` in it, a value or a mapping's
    key, as its text and each tuple as a list: what a study's user attributes hold (Optuna stores JSON), so
    a stored rule list stays the ``list[str]`` of :func:`rules_texts`."""
    if isinstance(value, FaRule):
        return value.text
    if isinstance(value, Mapping):
        return {as_stored(k): as_stored(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [as_stored(v) for v in value]
    return value
