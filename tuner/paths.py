"""Where tuner keeps its caches and where its data files live."""

from __future__ import annotations

__all__ = ["tuner_home", "data_dir", "package_data"]

import os
from pathlib import Path

_PKG = Path(__file__).resolve().parent


def tuner_home() -> Path:
    """``$TUNER_HOME``, default ``~/.cache/tuner``; created on first use."""
    home = Path(os.environ.get("TUNER_HOME") or Path.home() / ".cache" / "tuner").expanduser()
    home.mkdir(parents=True, exist_ok=True)
    return home


def data_dir(name: str) -> Path:
    """A top-level data folder (``templates``, ``search_spaces``).

    In a source checkout (editable install) it is the repo's folder; in a wheel it is the copy
    hatch puts under ``tuner/_data``.
    """
    for cand in (_PKG.parent / name, _PKG / "_data" / name):
        if cand.is_dir():
            return cand
    raise FileNotFoundError(f"tuner data folder {name!r} not found next to {_PKG}")


def package_data(name: str) -> Path:
    """A file shipped inside the package (``tuner/data/NAME``)."""
    return _PKG / "data" / name
