"""Only tuner/study/ touches Optuna user attributes: search writes and result reads them through
StudyState and the record (load_outcome), so every key is named in one place and search and result cannot drift apart on one."""

from __future__ import annotations

import re
from pathlib import Path

TUNER = Path(__file__).resolve().parents[3] / "tuner"

# `.user_attrs` read (attribute access: a `user_attrs=` keyword passes a dict built in tuner.study) or a write.
ACCESS = re.compile(r"\.user_attrs\b|\bset_user_attr\(|\bset_trial_user_attr\(")

ALLOWED: dict[str, str] = {}
"""Modules outside tuner/study/ that may still touch attributes, each with why (none left)."""


def _offenders() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for py in sorted(TUNER.rglob("*.py")):
        rel = py.relative_to(TUNER).as_posix()
        if rel.startswith("study/"):
            continue
        hits = [f"{rel}:{i}: {ln.strip()}" for i, ln in enumerate(py.read_text().splitlines(), 1) if ACCESS.search(ln)]
        if hits:
            out[rel] = hits
    return out


def test_no_module_outside_tuner_study_touches_user_attributes() -> None:
    bad = {k: v for k, v in _offenders().items() if k not in ALLOWED}
    assert not bad, "read or write them through tuner.study (StudyState, load_outcome):\n" + "\n".join(
        h for v in bad.values() for h in v
    )
    stale = set(ALLOWED) - set(_offenders())
    assert not stale, f"no longer touch attributes; drop them from ALLOWED: {sorted(stale)}"


def test_the_pattern_finds_what_it_must() -> None:
    """The check is not vacuous: tuner/study/ itself matches, in both directions."""
    text = "\n".join(p.read_text() for p in (TUNER / "study").glob("*.py"))
    assert ACCESS.search("x = study.user_attrs.get('arch')") and ACCESS.search("t.user_attrs['reason']")
    assert ACCESS.search("trial.set_user_attr('status', 'ok')") and ACCESS.search(
        "storage.set_trial_user_attr(1, 'k', 2)"
    )
    assert not ACCESS.search("study.enqueue_trial(params, user_attrs=retry_attrs(n))")
    assert ".user_attrs" in text and "set_user_attr(" in text and "set_trial_user_attr(" in text
