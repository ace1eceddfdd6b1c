"""Nothing a user reads cites a document the user does not have (issue 27, item 3).

tuner/ (help, messages, data files, report generators), README.md, docs/ (every .md), the evidence READMEs
in results/, templates/ and search_spaces/ may cite in-repo docs, llama.cpp files and PRs, and vendor
documents, but never the project's unpublished planning papers ("seed 004", "§21.3"), the research notes
beside the repo (``../shared/research/...``), numbered work sessions ("session 9", ``session9/``) or the
machine-time notes of a lent GPU (device time, budgets, held seconds).
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = re.compile(
    r"seed ?0|§|shared/|research/|[Ss]ession[ -]?[0-9]|"
    # machine-time accounting of the lent GPU
    r"[Dd]evice time|held_s|budget_left|[Dd]evice budget|counted at \d+%|"
    # the research notes by name (docs/knobs.md is the repo's own, cited with its folder)
    r"\b(?:anchors|device|hip-compilecheck)\.md|(?<!docs/)\bknobs\.md"
)
# Names, not citations: the six-reference-build feature keeps its internal file and option names
# (docs/seed004-builds.md explains them).
ALLOWED = re.compile(r"seed004[-_]builds")


def _files() -> list[Path]:
    out = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "results").rglob("README.md"))]
    for top, exts in (("tuner", {".py", ".toml", ".j2", ".md"}), ("templates", None), ("search_spaces", None)):
        out += [p for p in sorted((REPO / top).rglob("*")) if p.is_file() and (exts is None or p.suffix in exts)]
    return out


def test_no_citation_of_documents_users_do_not_have() -> None:
    found = []
    for path in _files():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if FORBIDDEN.search(ALLOWED.sub("", line)):
                found.append(f"{path.relative_to(REPO)}:{n}: {line.strip()[:160]}")
    assert not found, "cite an in-repo doc or a public source instead:\n" + "\n".join(found)


def test_the_checked_set_is_not_empty() -> None:
    names = {p.relative_to(REPO).as_posix() for p in _files()}
    assert {
        "README.md",
        "docs/selector.md",
        "docs/h100.md",
        "docs/data/noise-floors/README.md",
        "results/sm_90/llama-3.2-1b-q4_k_m/evidence/README.md",
        "tuner/data/archs.toml",
        "search_spaces/gfx1151.toml",
        "tuner/cli/search_cmd.py",
    } <= names


def test_no_numbered_session_or_machine_time_note_is_caught() -> None:
    # the pattern itself: what the diary used to say is caught, ordinary words are not
    for bad in ("session 9", "docs/h100/session12/call2", "Device time: 1181 s", "held_s", "counted at 50%"):
        assert FORBIDDEN.search(ALLOWED.sub("", bad)), bad
    for ok in ("the child runs in its own session", "seed004-builds.md", "docs/h100.md"):
        assert not FORBIDDEN.search(ALLOWED.sub("", ok)), ok
