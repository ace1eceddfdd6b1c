from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session")
def tuner_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """TUNER_HOME for integration tests.

    Fetched sources, builds and synthetic models are expensive, so they are kept between test runs
    in ``$TUNER_TEST_HOME`` (default ``~/.cache/tuner-test``) where the machine allows; set
    ``TUNER_TEST_HOME=fresh`` to use a throw-away directory instead.
    """
    want = os.environ.get("TUNER_TEST_HOME", str(Path.home() / ".cache" / "tuner-test"))
    home = tmp_path_factory.mktemp("tuner-home") if want == "fresh" else Path(want)
    home.mkdir(parents=True, exist_ok=True)
    old = os.environ.get("TUNER_HOME")
    os.environ["TUNER_HOME"] = str(home)
    yield home
    if old is None:
        os.environ.pop("TUNER_HOME", None)
    else:
        os.environ["TUNER_HOME"] = old


@pytest.fixture()
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh, empty TUNER_HOME for unit tests."""
    home = tmp_path / "home"
    monkeypatch.setenv("TUNER_HOME", str(home))
    return home
