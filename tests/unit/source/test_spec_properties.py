"""Property-based tests of the SPEC parser: any text is either accepted and round-trips
(parse -> normalized -> parse gives the same SourceSpec) or refused with a UsageError -- never
another exception, which the CLI would report as a bug (exit 70)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from tuner._run import RunResult
from tuner.errors import UsageError
from tuner.source import fetch as F
from tuner.source import tree as T
from tuner.source.spec import SourceSpec, parse_spec

MMA = Path(__file__).resolve().parents[2] / "data" / "source" / "tree_mma"

# Every code point, surrogates and control characters included (argv can carry them through
# surrogateescape), plus text shaped like each scheme so the search reaches the deeper branches.
_ANY = st.text(st.characters(blacklist_categories=()), max_size=80)
_SHAPED = st.one_of(
    _ANY,
    st.builds(lambda s, r: f"{s}:{r}", st.sampled_from(["pypi", "git", "path", "PYPI", "pip", ""]), _ANY),
    st.builds(
        lambda n, op, v: f"pypi:{n}{op}{v}",
        st.sampled_from(["llama-cpp-python", "Llama_CPP.python", " llama-cpp-python ", "numpy", ""]),
        st.sampled_from(["==", "===", ">=", "~=", "=", "", "==="]),
        st.one_of(_ANY, st.from_regex(r"[0-9]+(\.[0-9]+){0,3}((a|b|rc)[0-9]+)?(\.post[0-9]+)?\s?", fullmatch=True)),
    ),
    st.builds(lambda u, r: f"git:{u}@{r}", _ANY, _ANY),
    st.builds(
        lambda p: f"path:{p}",
        st.one_of(_ANY, st.sampled_from(["~", "~nosuchuser/x", "/", ".", "a" * 300, str(MMA), f"{MMA}/", f" {MMA} "])),
    ),
)


def _check(text: str) -> SourceSpec | None:
    """Parse ``text``; a refusal must be a UsageError, an acceptance must round-trip."""
    try:
        parsed = parse_spec(text)
    except UsageError as err:
        assert str(err).strip() and "Traceback" not in str(err)
        return None
    again = parse_spec(parsed.normalized)
    assert again == parsed, (text, parsed, again)
    assert again.normalized == parsed.normalized
    return parsed


@settings(max_examples=1500, deadline=None)
@given(_SHAPED)
@example("")
@example("path:~nosuchuser/llama.cpp")
@example("path:" + "a" * 300)
@example("git:https://x/y@main\x00")
@example("git:http://x/\ny@main")
@example("pypi:llama-cpp-python==0.3.36\n")
def test_any_text_is_accepted_and_round_trips_or_refused(text: str) -> None:
    _check(text)


@settings(max_examples=200, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/\x00"), min_size=1, max_size=40))
@example(" trailing ")
@example("new\nline")
def test_path_spec_of_any_directory_name_round_trips_or_is_refused(name: str) -> None:
    """A real llama.cpp tree under any directory name: accepted with the same value, or refused."""
    assume(name not in (".", ".."))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / name
        try:
            (root / "ggml").mkdir(parents=True)
        except OSError:
            assume(False)  # a name this filesystem cannot hold
        (root / "CMakeLists.txt").write_text("")
        (root / "ggml" / "CMakeLists.txt").write_text("")
        parsed = _check(f"path:{root}")
        if parsed is not None:
            assert parsed.value == str(root.resolve())


def test_accepted_git_specs_carry_no_control_characters_or_spaces() -> None:
    """git receives the URL and REF as arguments: a NUL would crash the process start, a newline or
    space is never part of a real URL or ref."""
    for bad in ("git:https://x/y@ma in", "git:https://x/y@main\x00", "git:https://x/\ny@main", "git:ht tp://x@m"):
        with pytest.raises(UsageError, match="space or control"):
            parse_spec(bad)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    text=st.one_of(
        _SHAPED,
        st.just("pypi:llama-cpp-python==0.3.36"),
        st.just(f"path:{MMA}"),
        st.just("git:https://github.com/ggml-org/llama.cpp@b6129"),
    )
)
def test_cli_exit_is_0_or_2(text: str, tmp_path: Path) -> None:
    """Through ``tuner.cli:main``: an accepted SPEC fetches (stubbed here) and exits 0; a refused one
    exits 2. Exit 70 (a bug) is what this guards against."""
    from tuner.cli import main
    from tuner.source.spec import Source

    def fake_fetch(parsed: SourceSpec) -> Source:
        return Source(spec=parsed.normalized, source_id="0" * 16, root=MMA, commit=None, era="mma")

    assume(not text.startswith("-"))  # click reads those as options (its own exit 2)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNER_HOME", str(tmp_path / "home"))
        mp.setattr(F, "_fetch_pypi", fake_fetch)
        mp.setattr(F, "_fetch_git", fake_fetch)
        for mod in (F, T):
            mp.setattr(mod, "run", lambda cmd, **kw: RunResult(returncode=128, output="fatal", seconds=0.0))
        mp.setattr(sys, "argv", ["tuner", "source", "fetch", "--", text])
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code
    try:
        parse_spec(text)
        want = 0
    except UsageError:
        want = 2
    assert code == want, (text, code)
