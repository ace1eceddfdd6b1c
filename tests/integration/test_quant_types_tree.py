"""The quant-type list holds names the pinned tree's llama-quantize knows (QUANT_OPTIONS), none of them
one that needs an importance matrix."""

from __future__ import annotations

import re

import pytest

from tuner import source as S
from tuner.targets.quant_types import QUANT_TYPES

pytestmark = pytest.mark.integration


def test_every_quant_type_is_a_quant_option_of_the_pinned_tree(tree_a: S.Source) -> None:
    text = (tree_a.root / "tools/quantize/quantize.cpp").read_text()
    block = text[text.index("QUANT_OPTIONS = {") :]
    options = set(re.findall(r'\{\s*"(\w+)",\s*LLAMA_FTYPE_', block[: block.index("};")]))
    assert "Q4_K_M" in options and set(QUANT_TYPES) <= options
    needs_imatrix = {"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "Q2_K_S"}
    assert needs_imatrix <= options and not needs_imatrix & set(QUANT_TYPES)
