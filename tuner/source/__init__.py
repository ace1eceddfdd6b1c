"""The ``source`` stage: get a llama.cpp tree, identify it, and describe what it can be tuned with.

``spec`` (what a SPEC names), ``fetch`` (pypi/git/path trees and their cache), ``tree`` (era, commit,
CMake options, FlashAttention kernels) and ``pack`` (carry a tree to another machine). The public
names are re-exported here: ``from tuner.source import fetch_source``.
"""

from __future__ import annotations

from tuner.source.fetch import cached_source, fetch_source
from tuner.source.pack import pack_source, unpack_source
from tuner.source.spec import DEFAULT_SPEC, Source, parse_spec
from tuner.source.tree import CMakeOption, load_cmake_options, source_info

__all__ = [
    "DEFAULT_SPEC",
    "CMakeOption",
    "Source",
    "cached_source",
    "fetch_source",
    "load_cmake_options",
    "pack_source",
    "parse_spec",
    "source_info",
    "unpack_source",
]
