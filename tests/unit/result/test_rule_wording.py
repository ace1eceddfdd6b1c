"""The method paragraph names the rule that gave the verdicts: the search's decision rule where the points
say so (new searches), the earlier whole-CI-beyond-the-noise rule otherwise (stored results, separate runs)."""

from __future__ import annotations

from tuner.measure.decide import RULE_NAME
from tuner.result.tables import method_paragraph


def test_the_method_names_the_rule_that_decided() -> None:
    new = method_paragraph("paired rounds", rounds=[6], rule="sequential")
    old = method_paragraph("paired rounds", rounds=[6])
    assert RULE_NAME in new and "whole CI lies beyond" not in new
    assert RULE_NAME not in old and "whole CI lies beyond the noise reference" in old
    assert old.startswith(new.split(" Verdict (")[0])  # the measurement's description is the same
