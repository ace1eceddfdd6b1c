"""The source stage for real: pip downloads of the pinned sdists, a git clone, a packed tree that
CMake configures.

The extracted trees stay in the session ``tuner_home`` between runs; each run still drops the
SPEC index first, so pip really downloads the sdist again and the content id is re-derived from
its bytes (extraction is then skipped because the content-addressed tree is already there).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from tuner import source as S
from tuner._run import run
from tuner.errors import UsageError
from tuner.source import fetch as F
from tuner.source import tree as T

pytestmark = [
    pytest.mark.integration
    # tuner._run.run never closes the child's stdout pipe (reported to the lead); until it does,
    # the ResourceWarning it leaves would fail these tests under filterwarnings=error.
]

DATA = Path(__file__).resolve().parent.parent / "data" / "source"
SPECS = {"mma": "pypi:llama-cpp-python==0.3.36", "rocwmma": "pypi:llama-cpp-python==0.3.16"}


def _fail(*args: object, **kw: object) -> None:
    raise AssertionError(f"a cached fetch must not run anything: {args}")


@pytest.fixture(scope="session")
def fetched(tuner_home: Path) -> dict[str, S.Source]:
    out = {}
    for era, spec in SPECS.items():
        F.index_file(spec).unlink(missing_ok=True)
        out[era] = S.fetch_source(spec)
    return out


def test_pinned_sdists(fetched: dict[str, S.Source], tuner_home: Path) -> None:
    a, b = fetched["mma"], fetched["rocwmma"]
    assert (a.era, b.era) == ("mma", "rocwmma")
    assert a.commit == "0c1e57098"
    assert b.commit == "4227c9be4268ac844921b90f31595f81236bd317"
    for src in (a, b):
        assert src.root == tuner_home / "sources" / src.source_id / "llama.cpp"
        assert (src.root / "tools/llama-bench/llama-bench.cpp").is_file()
        meta = json.loads((src.root.parent / "source.json").read_text())
        assert meta["sdist_sha256"][:16] == src.source_id
    opts_a, opts_b = S.load_cmake_options(a.root), S.load_cmake_options(b.root)
    assert opts_a["GGML_CUDA_FA_QUANTS"].default == "q4_0-q4_0;q8_0-q8_0;f16-f16;bf16-bf16"
    assert opts_a["GGML_HIP_MMQ_MFMA"].default == "ON"
    assert "GGML_HIP_ROCWMMA_FATTN" not in opts_a and "GGML_CUDA_F16" not in opts_a
    assert opts_b["GGML_HIP_ROCWMMA_FATTN"].default == "OFF" and "GGML_CUDA_F16" in opts_b


def test_second_fetch_does_no_work(fetched: dict[str, S.Source], monkeypatch: pytest.MonkeyPatch) -> None:
    for mod in (F, T):
        monkeypatch.setattr(mod, "run", _fail)
    monkeypatch.setattr(F, "run_pip_download", _fail)
    monkeypatch.setattr(F, "_extract_vendor_tree", _fail)
    for era, spec in SPECS.items():
        start = time.monotonic()
        again = S.fetch_source(spec)
        assert time.monotonic() - start < 1.0
        assert again.cached and again.source_id == fetched[era].source_id and again.era == era


@pytest.mark.parametrize("era", ["mma", "rocwmma"])
def test_cli_info_json(fetched: dict[str, S.Source], era: str) -> None:
    # the real command line, in a child process (exit code, JSON on stdout)
    res = subprocess.run(
        [sys.executable, "-m", "tuner", "source", "info", SPECS[era], "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["era"] == era and info["source_id"] == fetched[era].source_id
    assert ("GGML_HIP_ROCWMMA_FATTN" in info["options"]) == (era == "rocwmma")
    assert all(info["tools"].values())
    if era == "mma":
        assert info["commit"].startswith("0c1e57098")
        assert info["fa_kernels"] == {"VEC": True, "TILE": True, "MMA": True, "WMMA": False}
        assert set(info["config_tables"]["tile"]["rows"]) == {"nvidia_fp16", "nvidia_fp32", "amd", "amd_rdna"}
        assert set(info["config_tables"]["mma"]["rows"]) == {"ampere", "turing", "volta", "rdna", "cdna"}
        assert info["fa_instances"]["fattn-vec"] == 49
    else:
        assert info["fa_kernels"]["WMMA"]
        assert "fattn_mma_f16_config" not in info["config_tables"]
        assert "64x64" in info["config_tables"]["mma_f16_config"]["specializations"]


def test_cli_bad_spec_exit_2() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "tuner", "source", "fetch", "pypi:numpy==2.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 2
    assert "only 'llama-cpp-python'" in res.stderr and "Traceback" not in res.stderr


def test_trimmed_pack_configures_for_cpu(fetched: dict[str, S.Source], tmp_path: Path) -> None:
    out = S.pack_source(fetched["mma"], tmp_path / "llama.cpp.tar.gz")
    size = out.stat().st_size
    print(f"trimmed pack of 0.3.36: {size / 1e6:.1f} MB")
    assert size < 25e6
    with tarfile.open(out) as tar:
        tar.extractall(tmp_path / "x", filter="data")
    tree = tmp_path / "x" / "llama.cpp"
    assert not (tree / "ggml/src/ggml-vulkan").exists() and (tree / "ggml/src/ggml-cuda/fattn.cu").is_file()
    cmake = shutil.which("cmake")
    assert cmake, "cmake is a tuner dependency"
    res = run(
        [
            cmake,
            "-S",
            str(tree),
            "-B",
            str(tmp_path / "build"),
            "-DLLAMA_CURL=OFF",
            "-DLLAMA_OPENSSL=OFF",
            "-DLLAMA_BUILD_SERVER=OFF",
            "-DGGML_NATIVE=OFF",
            "-DGGML_CCACHE=OFF",
        ],
        log_file=tmp_path / "configure.log",
        check=False,
        timeout=300,
        what="cmake configure",
    )
    assert res.returncode == 0, (tmp_path / "configure.log").read_text()[-3000:]
    assert (tmp_path / "build" / "CMakeCache.txt").is_file()


def test_git_fetch_from_local_bare_repo(tuner_home: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    shutil.copytree(DATA / "tree_mma", work)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    run([*git, "init", "-q", str(work)])
    run([*git, "-C", str(work), "add", "-A"])
    run([*git, "-C", str(work), "commit", "-q", "-m", "fixture"])
    run([*git, "-C", str(work), "tag", "v1"])
    commit = run(["git", "-C", str(work), "rev-parse", "HEAD"]).output.strip()
    bare = tmp_path / "llama.cpp.git"
    run(["git", "clone", "-q", "--bare", str(work), str(bare)])

    spec = f"git:file://{bare}@v1"
    src = S.fetch_source(spec, refresh=True)
    assert (src.era, src.commit, src.source_id) == ("mma", commit, commit[:16])
    assert (src.root / "ggml/src/ggml-cuda/fattn-mma-f16.cuh").is_file() and not (src.root / ".git").exists()
    assert S.fetch_source(spec).cached
    # a path: SPEC of the work tree itself reads HEAD from git
    assert S.fetch_source(f"path:{work}").commit == commit
    with pytest.raises(UsageError, match="no revision 'no-such-tag'"):
        S.fetch_source(f"git:file://{bare}@no-such-tag")
