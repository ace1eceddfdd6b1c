"""mypy --strict checks tuner/ (pyproject.toml [tool.mypy], run by .ci/run). A line may be let off only
by ``# type: ignore[code]`` followed by a comment saying why, and only a few lines in the whole package
may be: each one is a place the checker cannot follow, and each says what it cannot follow there."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

TUNER = Path(__file__).resolve().parents[2] / "tuner"
MAX_IGNORES = 5
IGNORE = re.compile(r"type:\s*ignore\b")
# ``# type: ignore[code, code]  # why``: the codes, then a comment of its own with some words in it.
EXPLAINED = re.compile(r"#\s*type:\s*ignore\[[a-z-]+(,\s*[a-z-]+)*\]\s+#\s*\w.*\w")


def ignores(source: str) -> list[tuple[int, str]]:
    """(line, comment text) of each comment that lets a line off the type check."""
    return [
        (tok.start[0], tok.line[tok.start[1] :].strip())
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT and IGNORE.search(tok.string)
    ]


def test_the_rule_tells_an_explained_ignore_from_a_bare_one() -> None:
    src = (
        "a = f()  # type: ignore[no-any-return]  # the library returns Any\n"
        "b = g()  # type: ignore[arg-type]\n"
        "c = h()  # type: ignore\n"
        's = "type: ignore in a string is no comment"\n'
    )
    found = ignores(src)
    assert [n for n, _ in found] == [1, 2, 3]
    assert [bool(EXPLAINED.fullmatch(text)) for _, text in found] == [True, False, False]


def test_few_type_ignores_in_tuner_each_with_its_code_and_reason() -> None:
    found = [
        (f"{path.relative_to(TUNER.parent)}:{n}", text)
        for path in sorted(TUNER.rglob("*.py"))
        for n, text in ignores(path.read_text())
    ]
    unexplained = [where for where, text in found if not EXPLAINED.fullmatch(text)]
    assert not unexplained, "write `# type: ignore[code]  # why` (the error code, then the reason):\n" + "\n".join(
        unexplained
    )
    assert len(found) <= MAX_IGNORES, (
        f"{len(found)} type: ignore comments in tuner/ (at most {MAX_IGNORES}); type the code instead:\n"
        + "\n".join(where for where, _ in found)
    )
