from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"

NO_INSTALL = "TUNER_TEST_NO_INSTALL"
"""Set (to anything but empty or 0) and no test fixture installs system packages: those tests skip instead."""


def no_install() -> bool:
    return os.environ.get(NO_INSTALL, "") not in ("", "0")


def say(config: pytest.Config, line: str) -> None:
    """One line on the terminal now, past pytest's capture (a fixture's own print shows only if a test fails)."""
    tr = config.pluginmanager.get_plugin("terminalreporter")
    capman = config.pluginmanager.get_plugin("capturemanager")
    if tr is None:
        print(line, file=sys.__stderr__, flush=True)
        return
    with capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext():
        tr.write_line(line)


def use_render_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    """``tuner.source.fetch_source`` returns the small rendering tree (``tests/data/render/treeA``, era mma), so a
    dry run renders and checks its space without fetching llama.cpp."""
    import types

    import tuner.source

    monkeypatch.setattr(
        tuner.source,
        "fetch_source",
        lambda spec=None: types.SimpleNamespace(
            root=DATA / "render" / "treeA", era="mma", spec=str(spec), source_id="a" * 16, commit="0c1e570"
        ),
    )


@pytest.fixture(autouse=True)
def _fresh_local_archs() -> None:
    """Each test detects the GPUs afresh: tuner asks once per process, and tests fake the devices."""
    from tuner.targets.archs import forget_local_archs

    forget_local_archs()


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


@pytest.fixture(scope="session")
def tree_a(tuner_home: Path):
    """The pinned llama.cpp of era ``mma`` (llama-cpp-python==0.3.36), fetched through tuner."""
    from tuner.source import DEFAULT_SPEC, fetch_source

    return fetch_source(DEFAULT_SPEC)


@pytest.fixture(scope="session")
def tree_b(tuner_home: Path):
    """The pinned llama.cpp of era ``rocwmma`` (llama-cpp-python==0.3.16)."""
    from tuner.source import fetch_source

    return fetch_source("pypi:llama-cpp-python==0.3.16")


@pytest.fixture(scope="session")
def cpu_build(tree_a, tuner_home: Path, pytestconfig: pytest.Config):
    """A real CPU build of llama-bench, test-backend-ops and llama-quantize from tree A (cached)."""
    from tuner.builder.cmake import build_variant, is_built
    from tuner.plan.render import render_variant

    rv = render_variant(tree_a, "cpu", "cpu", local_archs=[])
    targets = ("llama-bench", "test-backend-ops", "llama-quantize")
    if not is_built(rv, targets):  # else pytest would sit silent for the whole compile
        say(
            pytestconfig,
            f"building llama.cpp for the integration tests (cold cache: about 20 min on 2 cores; this machine has "
            f"{os.cpu_count()}) ... log: {tuner_home / 'builds' / rv.key / 'logs'}",
        )
    return build_variant(rv, targets=targets)


@pytest.fixture(scope="session")
def cpu_shared_bin(cpu_build) -> Path:
    """The CPU build's bin dir with its shared libggml*.so, which fa-bench and mm-bench link against."""
    bin_dir = Path(cpu_build.bin_dir)
    if not (bin_dir / "libggml.so").exists():
        pytest.skip(f"the CPU build at {bin_dir} has no shared libggml.so to link a bench program against")
    return bin_dir


@pytest.fixture(scope="session")
def tiny_model(tree_a) -> Path:
    """The `tiny` synthetic model (llama arch, head size 64, GQA 4), made once."""
    from tuner.targets.models import synth_cached

    return synth_cached("tiny", source=tree_a)


@pytest.fixture(scope="session")
def hip_toolchain(tuner_home: Path, pytestconfig: pytest.Config):
    """The HIP compile-check toolchain (clang-19 + Debian ROCm headers), set up on first use.

    Setting it up needs root for apt-get (CI runs as root) and installs system packages, which it
    says on the terminal first; without root, or with ``TUNER_TEST_NO_INSTALL=1``, the tests that
    need it are skipped with the command that sets it up.
    """
    from tuner.builder.hip import _SYSTEM_PACKAGES, default_prefix, find_hip_toolchain, run_hip_setup
    from tuner.errors import TunerError

    tc = find_hip_toolchain()
    if tc is not None:
        return tc
    setup = f"`TUNER_HOME={tuner_home} tuner toolchain hip` as root"
    if no_install():
        pytest.skip(
            f"HIP toolchain not set up, and {NO_INSTALL} is set: setting it up would apt-get install "
            f"{' '.join(_SYSTEM_PACKAGES)} system-wide; unset {NO_INSTALL} or run {setup}"
        )
    if os.geteuid() != 0:
        pytest.skip(f"HIP toolchain not set up; run {setup}")
    say(
        pytestconfig,
        f"setting up the HIP toolchain for the HIP tests: apt-get update && apt-get install -y "
        f"{' '.join(_SYSTEM_PACKAGES)} (system-wide, as root), ROCm -dev packages unpacked into {default_prefix()} "
        f"(about a minute and 600 MB); {NO_INSTALL}=1 skips these tests instead",
    )
    try:
        return run_hip_setup()[0]
    except TunerError as err:  # registry unreachable: say why instead of failing unrelated tests
        pytest.skip(f"HIP toolchain setup failed: {err}")
