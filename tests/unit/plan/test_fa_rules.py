"""One FlashAttention rule form (tuner/plan/fa_rules.py): the stored results' rules round-trip through it,
their C++ conditions in upstream.patch are what rule_condition emits, and no other module reads or
writes rule text by hand."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from tuner._compat import tomllib
from tuner.errors import UsageError
from tuner.plan.fa_rules import (
    FA_RULES_MAX,
    FaRule,
    Phase,
    as_stored,
    parse_fa_rules,
    rules_env,
    rules_from_texts,
    rules_texts,
)
from tuner.result.upstream_patch import rule_condition
from tuner.targets.archs import load_arch

ROOT = Path(__file__).resolve().parents[3]
RESULTS = sorted((ROOT / "results").glob("*/*/config.toml"))


def _stored_rule_texts(cfg: dict) -> list[str]:
    """Every rule text a result's config.toml holds: the exported rules, the dropped ones, the narrowed ones,
    the rejected ones."""
    choice = cfg["choice"]
    return [
        *choice["fa_rules"],
        *choice.get("dropped_rules", {}),
        *choice.get("narrowed_rules", {}),
        *((cfg.get("gate") or {}).get("rejected") or {}).get("rules", []),
        *(cfg.get("residency") or {}).get("rejected_rules", []),
    ]


def test_the_stored_results_hold_rules_to_check() -> None:
    assert len(RESULTS) >= 5
    assert sum(len(_stored_rule_texts(tomllib.loads(p.read_text()))) for p in RESULTS) >= 2


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.parent.name)
def test_stored_rules_round_trip(path: Path) -> None:
    """text -> FaRule -> env text -> FaRule, and back to the text config.toml and the study hold."""
    texts = _stored_rule_texts(tomllib.loads(path.read_text()))
    for text in texts:
        (rule,) = rules_from_texts([text])
        assert rule.text == text and str(rule) == text
        assert parse_fa_rules(rules_env([rule])) == (rule,)
        assert as_stored({rule: [rule]}) == {text: [text]}
    rules = rules_from_texts(texts)
    assert rules_texts(rules) == texts and parse_fa_rules(rules_env(rules)) == rules
    assert json.loads(json.dumps(as_stored({"rules": rules}))) == {"rules": texts}  # what Optuna stores


def _patch_conditions(patch: str) -> tuple[list[str], list[str]]:
    """The rule conditions and returned kernels the patch adds (the first ``if`` is the arch's cc check)."""
    added = " ".join(ln[1:].strip() for ln in patch.splitlines() if ln.startswith("+") and not ln.startswith("+++"))
    conds = re.findall(r"if \((.*?)\) \{", added)
    return conds[1:], re.findall(r"return (BEST_FATTN_KERNEL_\w+);", added)


@pytest.mark.parametrize(
    "path", [p for p in RESULTS if (p.parent / "upstream.patch").is_file()], ids=lambda p: p.parent.name
)
def test_stored_upstream_patch_conditions_are_rule_conditions(path: Path) -> None:
    cfg = tomllib.loads(path.read_text())
    rules = rules_from_texts(cfg["choice"]["fa_rules"])
    arch = load_arch(cfg["target"]["arch"])
    conds, returns = _patch_conditions((path.parent / "upstream.patch").read_text())
    assert rules and conds == [" && ".join(rule_condition(r, arch)) for r in rules]
    kernel = {"VEC": "BEST_FATTN_KERNEL_VEC", "TILE": "BEST_FATTN_KERNEL_TILE", "MMA": "BEST_FATTN_KERNEL_MMA_F16"}
    assert returns == [kernel[r.kernel] for r in rules]


def test_a_study_holds_what_it_always_held() -> None:
    """The pipeline stores rules as list[str] through StudyState (old studies load, resumed ones find their
    records), keys its per-config records by the same texts as before, and the typed record reads them back."""
    from tuner._hash import stable_hash
    from tuner.search.final_gates import config_key as _config_key
    from tuner.study.record import outcome_from_attrs
    from tuner.study.state import StudyState

    class Study:
        def __init__(self) -> None:
            self.user_attrs: dict = {}

        def set_user_attr(self, k: str, v: object) -> None:
            self.user_attrs[k] = json.loads(json.dumps(v))  # Optuna's RDB storage keeps JSON

    texts = ["decode/D64/gqa4/kvf16:32768-=TILE", "prefill:0-4096=MMA"]
    rules = rules_from_texts(texts)
    study = Study()
    st = StudyState(study)
    st.set_result({"rules": rules, "dropped": {rules[1]: "slower"}, "gate": {"rejected": {"rules": rules[:1]}}})
    assert st.result() == {"rules": texts, "dropped": {texts[1]: "slower"}, "gate": {"rejected": {"rules": texts[:1]}}}
    st.set_compose({"rules": rules, "decisions": [], "shape": "D64/gqa4/kvf16"})
    assert study.user_attrs["compose"]["rules"] == texts
    out = outcome_from_attrs(study.user_attrs)
    assert out.rules == rules and dict(out.dropped) == {rules[1]: "slower"}
    assert out.result_json()["rules"] == texts and out.result_json()["dropped"] == {texts[1]: "slower"}
    assert _config_key(rules, {"threads": 4}) == stable_hash({"rules": texts, "tuned": {"threads": 4}})[:12]


def test_phase_spellings() -> None:
    assert [(p.value, p.bench) for p in Phase] == [("decode", "tg"), ("prefill", "pp")]
    assert all(Phase.from_bench(p.bench) is p for p in Phase)
    with pytest.raises(ValueError):
        Phase.from_bench("decode")
    assert f"{Phase.DECODE}" == "decode" and json.dumps(Phase.PREFILL) == '"prefill"'
    # a phase given as text is the same rule
    assert FaRule(phase="decode", lo=0, hi=None, kernel="MMA") == FaRule(
        phase=Phase.DECODE, lo=0, hi=None, kernel="MMA"
    )


def test_env_text_is_canonical_and_bounded() -> None:
    rules = parse_fa_rules(" decode/kvf16/D64:0-4096=VEC , prefill:8192-=MMA")
    assert rules_env(rules) == "decode/D64/kvf16:0-4096=VEC,prefill:8192-=MMA"  # no spaces: the C++ hook keeps them
    assert rules[0].covers(0) and rules[0].covers(4095) and not rules[0].covers(4096) and rules[1].covers(1 << 40)
    assert rules[0].widened() == FaRule(phase=Phase.DECODE, lo=0, hi=None, kernel="VEC", D=64, kv="f16")
    with pytest.raises(UsageError, match="at most 32"):
        rules_from_texts(["decode:0-=VEC"] * (FA_RULES_MAX + 1))
    with pytest.raises(UsageError, match="not phase:lo-hi=KERNEL"):
        rules_from_texts(["decode:0-=WMMA"])


# -------------------------------------------------------------------------------------------------------------
# Nothing outside tuner/plan/fa_rules.py reads or writes rule text by hand.

_SEPARATORS = {",", ":", "=", "/"}
_SPELLINGS = {"tg": "decode", "pp": "prefill"}


def _hand_made_rule_code(path: Path, root: Path = ROOT) -> list[str]:
    """Findings ``file:line: what`` of code that reads or writes rule text itself."""
    src = path.read_text()
    tree = ast.parse(src)
    out = []

    def where(node: ast.AST, what: str) -> str:
        return f"{path.relative_to(root)}:{getattr(node, 'lineno', '?')}: {what}"

    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):  # f"{phase}:{lo}-{hi}={kernel}": a rule written by hand
            seq = "".join("X" if not isinstance(v, ast.Constant) else str(v.value) for v in node.values)
            if re.search(r"X:X-X?=X", seq.replace(" ", "")) or re.search(r":0-=X", seq):
                out.append(where(node, "an f-string writes a rule"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "(decode|prefill)" in node.value:
            out.append(where(node, "a regex reads a rule"))
        elif isinstance(node, ast.Dict):  # a tg/pp <-> decode/prefill table of its own
            pairs = {
                (k.value, v.value)
                for k, v in zip(node.keys, node.values)
                if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)
            }
            if pairs & ({*_SPELLINGS.items()} | {(b, a) for a, b in _SPELLINGS.items()}):
                out.append(where(node, "a phase spelling table (use Phase.bench / Phase.from_bench)"))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = ast.get_source_segment(src, node) or ""
            if not re.search(r"rule|FA_RULES", body, re.I):
                continue
            for call in ast.walk(node):
                if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
                    continue
                name, args = call.func.attr, call.args
                if (
                    name in ("split", "rsplit", "partition", "rpartition")
                    and args
                    and isinstance(args[0], ast.Constant)
                    and args[0].value in _SEPARATORS
                ):
                    out.append(where(call, f"{node.name} splits text on {args[0].value!r}"))
                if (
                    name == "join"
                    and isinstance(call.func.value, ast.Constant)
                    and call.func.value.value == ","
                    and re.search(r"rule", ast.get_source_segment(src, call) or "", re.I)
                ):
                    out.append(where(call, f"{node.name} joins rules (use rules_env)"))
    return out


def test_no_module_but_fa_rules_reads_or_writes_rule_text() -> None:
    modules = [p for p in sorted((ROOT / "tuner").rglob("*.py")) if p != ROOT / "tuner/plan/fa_rules.py"]
    assert len(modules) > 50
    found = [v for p in modules for v in _hand_made_rule_code(p)]
    assert not found, "\n".join(found)


def test_the_checker_finds_the_old_splitters(tmp_path: Path) -> None:
    """What the search did before tuner/plan/fa_rules.py, each a finding (so the check above checks something)."""
    old = tmp_path / "old.py"
    old.write_text("""
import re
_RULE_BOUNDS = re.compile(r"^(decode|prefill)[^:]*:(\\d+)-(\\d*)=(\\w+)$")
PHASE_RULE = {"pp": "prefill", "tg": "decode"}

def candidates(phase, k):
    return f"{PHASE_RULE[phase]}:0-={k}"

def rule_text(phase, key, lo, hi, kernel):
    return f"{phase}{key}:{lo}-{'' if hi is None else hi}={kernel}"

def phase_rules(env, want):
    text = env.get("GGML_TUNER_FA_RULES", "")
    return [r for r in text.split(",") if r and r.split(":", 1)[0] == want]

def widened(rules):
    return [r.partition("=")[2] for r in rules]

def env_of(rules):
    return {"GGML_TUNER_FA_RULES": ",".join(rules)}
""")
    found = sorted(f.split(": ", 1)[1] for f in _hand_made_rule_code(old, tmp_path))
    assert found == sorted(
        [
            "a regex reads a rule",
            "a phase spelling table (use Phase.bench / Phase.from_bench)",
            "an f-string writes a rule",
            "an f-string writes a rule",
            "phase_rules splits text on ','",
            "phase_rules splits text on ':'",
            "widened splits text on '='",
            "env_of joins rules (use rules_env)",
        ]
    )
