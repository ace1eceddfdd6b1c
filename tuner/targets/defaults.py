"""Defaults that more than one command states, kept here once (light: read while the CLI is parsed)."""

from __future__ import annotations

DEFAULT_QUANT = "Q4_K_M"
"""A synthesized ``--like`` model's weight type when ``--quant`` is not given: what ``tuner search`` measures
(on a GPU and on the CPU), what ``tuner estimate`` bounds and what ``tuner sweep confirm`` confirms on; the
type users run (an f16 model measures another decode balance)."""
