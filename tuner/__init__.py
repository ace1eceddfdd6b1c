"""tuner: find the fastest way to build and run llama.cpp on a given GPU."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
