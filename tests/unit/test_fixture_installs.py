"""The test suite's own fixtures: what they install as root is said first and can be refused, and a cold
llama.cpp build says so on the terminal instead of leaving pytest silent for minutes.

Each case runs pytest on a copy of tests/conftest.py with its default output capture, so a line that only
a failing test would show does not count; the toolchain setup and the build are faked."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"
PACKAGES = "clang-19 lld-19 clang-tools-19 libclang-rt-19-dev ninja-build"

HIP_TEST = """
import os
import tuner.builder.hip as hip
from tuner.errors import TunerError

hip.find_hip_toolchain = lambda *a, **k: None
os.geteuid = lambda: 0  # the root path, without root


def _setup(*a, **k):
    open(os.environ["SETUP_MARK"], "w").close()
    raise TunerError("faked setup")


hip.run_hip_setup = _setup


def test_needs_hip(hip_toolchain):
    pass
"""

BUILD_TEST = """
import types
import pytest
import tuner.builder.cmake as cmake
import tuner.plan.render as render

render.render_variant = lambda *a, **k: types.SimpleNamespace(key="cpu-key")
cmake.is_built = lambda rv, targets: False
cmake.build_variant = lambda rv, targets: "built"


@pytest.fixture(scope="session")
def tree_a():
    return None


def test_needs_build(cpu_build):
    assert cpu_build == "built"
"""


def _run(tmp_path: Path, test: str, **env: str) -> subprocess.CompletedProcess[str]:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_it.py").write_text(test, encoding="utf-8")
    environ = {k: v for k, v in os.environ.items() if k != "TUNER_TEST_NO_INSTALL"}
    environ.update(TUNER_TEST_HOME=str(tmp_path / "home"), SETUP_MARK=str(tmp_path / "setup-ran"), **env)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "no:randomly", "test_it.py"],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_hip_setup_names_what_it_installs_before_it_runs(tmp_path: Path) -> None:
    r = _run(tmp_path, HIP_TEST)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "setup-ran").exists()
    line = next((ln for ln in r.stdout.splitlines() if "apt-get install" in ln and "faked" not in ln), "")
    assert PACKAGES in line and "TUNER_TEST_NO_INSTALL=1" in line


def test_no_install_skips_with_the_packages_and_the_variable(tmp_path: Path) -> None:
    r = _run(tmp_path, HIP_TEST, TUNER_TEST_NO_INSTALL="1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (tmp_path / "setup-ran").exists()
    skip = next((ln for ln in r.stdout.splitlines() if ln.startswith("SKIPPED")), "")
    assert PACKAGES in skip and "TUNER_TEST_NO_INSTALL" in skip


def test_cold_build_prints_a_progress_line(tmp_path: Path) -> None:
    r = _run(tmp_path, BUILD_TEST)
    assert r.returncode == 0, r.stdout + r.stderr
    line = next((ln for ln in r.stdout.splitlines() if "building llama.cpp for the integration tests" in ln), "")
    assert "min on 2 cores" in line and str(tmp_path / "home" / "builds" / "cpu-key") in line
