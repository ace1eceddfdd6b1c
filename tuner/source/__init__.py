"""The ``source`` stage: get a llama.cpp tree, identify it, and describe what it can be tuned with.

``spec`` (what a SPEC names), ``fetch`` (pypi/git/path trees and their cache), ``tree`` (era, commit,
CMake options, FlashAttention kernels) and ``pack`` (carry a tree to another machine). The public
names are re-exported here: ``from tuner.source import fetch_source``.
"""

from __future__ import annotations

from tuner.source.fetch import cached_source, fetch_source, run_pip_download
from tuner.source.pack import pack_source, unpack_source
from tuner.source.spec import DEFAULT_SPEC, Source, SourceSpec, parse_spec
from tuner.source.tree import (
    ERAS,
    CMakeOption,
    find_commit,
    find_era,
    load_cmake_options,
    parse_cmake_commands,
    source_info,
)

__all__ = [
    "DEFAULT_SPEC",
    "ERAS",
    "CMakeOption",
    "Source",
    "SourceSpec",
    "cached_source",
    "fetch_source",
    "find_commit",
    "find_era",
    "load_cmake_options",
    "pack_source",
    "parse_cmake_commands",
    "parse_spec",
    "run_pip_download",
    "source_info",
    "unpack_source",
]
