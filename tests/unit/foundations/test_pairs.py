"""Every ``NAME=VALUE`` option goes through one parser (tuner.pairs): build's --set, the search space's --set,
search's --set and the --env options split, strip and refuse alike."""

from __future__ import annotations

import pytest

from tuner.cli.build_cmd import parse_sets
from tuner.errors import UsageError
from tuner.pairs import parse_pairs
from tuner.plan import space


def test_split_at_the_first_equals_and_stripped() -> None:
    assert parse_pairs([" A = 1 ", "B=x=y", "A=2"], "--env", "A=1") == {"A": "2", "B": "x=y"}


@pytest.mark.parametrize("item", ["T3", "=4096", " =1"])
def test_every_set_parser_refuses_alike(item: str) -> None:
    sp = space.load_space("sm_90", "mma")
    messages = []
    for parse in (
        lambda: parse_sets([item]),
        lambda: space.parse_set_values(sp, [item]),
        lambda: parse_pairs([item], "--set", "T3=4096", what="KNOB"),
    ):
        with pytest.raises(UsageError) as err:
            parse()
        messages.append(str(err.value).split(" Example:")[0])
    assert len(set(messages)) == 1, messages
    assert messages[0].startswith(f"--set {item!r}") and "KNOB" in messages[0]


def test_values_are_typed_by_the_caller() -> None:
    sp = space.load_space("sm_90", "mma")
    assert parse_sets(["tile_nthreads = 0x80"]) == {"tile_nthreads": 128}
    assert space.parse_set_values(sp, [" T3 = 4096 "]) == ({}, {"T3": 4096})
    assert space.set_values(sp, {"T3": "4096"}) == space.parse_set_values(sp, ["T3=4096"])
    with pytest.raises(UsageError, match="must be an integer"):
        parse_sets(["tile_nthreads=big"])
