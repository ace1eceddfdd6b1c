"""Property tests of the parsers a user's text reaches: ``--set``, ``--depths``, ``--storage`` and FA
rule strings. Any input is either accepted, and what was accepted round-trips through its text form,
or refused with a usage error (exit 2); no other exception ever escapes."""

from __future__ import annotations

import click
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as hs

from tuner.cli._params import depths_option
from tuner.errors import UsageError
from tuner.pairs import parse_pairs

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# text a shell can pass: any printable character plus the separators the grammars use
_TEXT = hs.text(alphabet=hs.characters(blacklist_categories=("Cs",)), max_size=40)
_NEAR = hs.text(alphabet="0123456789,-= :/DgqakvfVECTILMAdeoprfil_.x+١", max_size=40)  # near the grammars


def _refused(err: BaseException) -> bool:
    return isinstance(err, (UsageError, click.BadParameter)) and getattr(err, "exit_code", 2) == 2


@SETTINGS
@given(hs.one_of(_TEXT, _NEAR, hs.lists(hs.integers(-5, 2_000_000)).map(lambda xs: ",".join(map(str, xs)))))
@example("0,4096,,16384")
@example("١٢")  # non-ASCII digits: int() takes them, llama-bench's -d would not
@example("1_000")
def test_depths_accepts_or_refuses(text: str) -> None:
    try:
        ds = depths_option(None, None, text)  # type: ignore[arg-type]
    except Exception as err:
        assert _refused(err), repr(err)
        return
    assert ds and list(ds) == sorted(set(ds)) and all(isinstance(d, int) and 0 <= d <= 1_048_576 for d in ds)
    assert depths_option(None, None, ",".join(map(str, ds))) == ds  # type: ignore[arg-type]
    assert text.replace(" ", "").replace(",", "").isascii() and all(c in "0123456789, " for c in text)


@SETTINGS
@given(hs.lists(hs.one_of(_TEXT, _NEAR), max_size=4))
@example(["=5"])
@example([" = "])
def test_set_pairs_accept_or_refuse(items: list[str]) -> None:
    try:
        out = parse_pairs(tuple(items), "--set", "variant=cpu")
    except Exception as err:
        assert _refused(err), repr(err)
        return
    assert all(k and k == k.strip() and "=" not in k for k in out)
    assert parse_pairs(tuple(f"{k}={v}" for k, v in out.items()), "--set", "variant=cpu") == out


@pytest.fixture(scope="module")
def cpu_space():
    from tuner.plan.space import load_space

    return load_space("cpu", "mma")


@SETTINGS
@given(
    hs.lists(
        hs.one_of(
            _TEXT,
            _NEAR,
            hs.sampled_from(
                [
                    "ubatch=128",
                    "ubatch=7",
                    "flash_attn=off",
                    "threads=default",
                    "threads=",
                    "ubatch=1e3",
                    "ubatch= 256 ",
                    "nosuch=1",
                ]
            ),
        ),
        max_size=3,
    )
)
def test_set_values_against_a_space_accept_or_refuse(cpu_space, items: list[str]) -> None:
    from tuner.plan.space import parse_set_values

    try:
        cv, rv = parse_set_values(cpu_space, items)
    except Exception as err:
        assert _refused(err), repr(err)
        return
    again = parse_set_values(cpu_space, [f"{k}={v}" for k, v in {**cv, **rv}.items()])
    assert again == (cv, rv)


@SETTINGS
@given(
    hs.one_of(
        _TEXT,
        _NEAR,
        hs.from_regex(
            r"(decode|prefill)(/D[0-9]{1,5}|/gqa[0-9]{1,4}|/kv[a-z0-9_]{1,6}){0,3}:[0-9]{1,6}-[0-9]{0,6}=(VEC|TILE|MMA)(,(decode|prefill):[0-9]{1,3}-=(VEC|MMA))?",
            fullmatch=True,
        ),
    )
)
@example("decode:١-=MMA")  # Unicode digits: the C++ hook reads ASCII only
@example("decode/D64/gqa4/kvf16:32768-=MMA, prefill:0-4096=TILE")
@example(",".join(["decode:0-=VEC"] * 33))
def test_fa_rules_accept_or_refuse(text: str) -> None:
    from tuner.plan.fa_rules import parse_fa_rules

    try:
        rules = parse_fa_rules(text)
    except Exception as err:
        assert _refused(err), repr(err)
        return
    # what the C++ hook is given is what it can read: ASCII digits (strtoll), at most its 32 entries
    assert all(c.isascii() or c.isspace() for c in text) and len(rules) <= 32
    rendered = ",".join(r.text for r in rules)
    assert parse_fa_rules(rendered) == rules


@SETTINGS
@given(
    hs.one_of(
        _TEXT,
        _NEAR,
        hs.from_regex(r"(sqlite|postgresql|postgresql\+psycopg|mysql|redis)://[a-z:@/.0-9?=_-]{0,30}", fullmatch=True),
    )
)
@example("sqlite:///")
@example("postgresql://u:p@h:70000/db")
@example("sqlite:///tuner-study-property.db")
def test_storage_urls_accept_or_refuse(text: str) -> None:
    from tuner.study.storage import check_storage_url

    try:
        url = check_storage_url(text)
    except Exception as err:
        assert _refused(err), repr(err)
        return
    assert url == text and check_storage_url(url) == url  # accepted as given: the study is where it says
    assert "memory" not in url and "://" in url
