"""The study below search and result: where it is stored (:mod:`tuner.study.storage`), the named
attributes a search keeps in it (:mod:`tuner.study.state`) and the typed record of a finished search
that the export works from (:mod:`tuner.study.record`). Neither search nor result reads an Optuna
attribute by name; both go through here."""

from __future__ import annotations

__all__ = ["SearchOutcome", "StudyHeader", "StudyState", "check_storage_url", "load_outcome", "make_storage"]

from tuner.study.record import SearchOutcome, StudyHeader, load_outcome
from tuner.study.state import StudyState
from tuner.study.storage import check_storage_url, make_storage
