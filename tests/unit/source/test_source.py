"""Unit tests for tuner.source: SPECs, CMake option parsing, era/commit, cache, info, pack.

No real subprocess runs here: pip and git are replaced by fakes (``run`` in ``tuner.source.fetch``/``tree`` or
``tuner.source.fetch.run_pip_download``), and the trees are the tiny fixtures in tests/data/source.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import sys
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from tuner import source as S
from tuner._run import RunResult
from tuner.errors import TunerError, UsageError
from tuner.source import fetch as F
from tuner.source import tree as T

DATA = Path(__file__).resolve().parents[2] / "data" / "source"
MMA = DATA / "tree_mma"
ROCWMMA = DATA / "tree_rocwmma"


def _fail(*args: object, **kw: object) -> None:
    raise AssertionError(f"must not be called: {args}")


@pytest.fixture()
def no_git(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every subprocess answers 'not a git repository'."""
    for mod in (F, T):
        monkeypatch.setattr(mod, "run", lambda cmd, **kw: RunResult(returncode=128, output="fatal", seconds=0.0))


# ---------------------------------------------------------------- SPEC parsing


def test_default_spec_and_normalization() -> None:
    assert S.parse_spec(None).normalized == S.DEFAULT_SPEC == "pypi:llama-cpp-python==0.3.36"
    p = S.parse_spec(" pypi:Llama_CPP.python==0.3.16 ")
    assert (p.scheme, p.value, p.normalized) == ("pypi", "0.3.16", "pypi:llama-cpp-python==0.3.16")
    g = S.parse_spec("git:https://github.com/ggml-org/llama.cpp@b6129")
    assert (g.value, g.ref) == ("https://github.com/ggml-org/llama.cpp", "b6129")
    ssh = S.parse_spec("git:git@github.com:lhl/llama.cpp@rocm7-strixhalo-rocwmma-fix")
    assert (ssh.value, ssh.ref) == ("git@github.com:lhl/llama.cpp", "rocm7-strixhalo-rocwmma-fix")
    assert S.parse_spec(f"path:{MMA}").value == str(MMA.resolve())


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("pip:llama-cpp-python==0.3.36", ["no known scheme", "'pypi'", "path:DIR"]),
        ("llama-cpp-python==0.3.36", ["no known scheme"]),
        ("pypi:llama-cpp-python>=0.3.16", ["not pinned", "=="]),
        ("pypi:llama-cpp-python", ["not pinned"]),
        ("pypi:llama-cpp-python==0.3.*", ["not a release version"]),
        ("pypi:torch==2.5.0", ["'torch'", "only 'llama-cpp-python'"]),
        ("git:https://github.com/ggml-org/llama.cpp", ["does not name a revision", "@REF"]),
        ("git:--upload-pack=evil@main", ["may not start with '-'"]),
        ("path:/nonexistent/llama.cpp", ["does not exist"]),
        (f"path:{DATA}", ["not a llama.cpp tree", "CMakeLists.txt"]),
    ],
)
def test_bad_specs_are_usage_errors(spec: str, words: list[str]) -> None:
    with pytest.raises(UsageError) as err:
        S.parse_spec(spec)
    assert err.value.exit_code == 2
    for w in words:
        assert w in str(err.value)


# ---------------------------------------------------------------- CMake parsing


def test_parse_cmake_commands_handles_comments_quotes_and_lines() -> None:
    text = (
        'if (A)\n  option(X "a \\"quoted\\" help" ON) # c\nendif()\n'
        '#[[ option(HIDDEN "no" ON) ]]\n'
        'set(Y\n  "v(1)"\n  CACHE STRING "h")\n'
    )
    cmds = [(c, a, line, d) for c, a, line, d in T.parse_cmake_commands(text) if c in ("option", "set")]
    assert cmds == [
        ("option", ["X", 'a "quoted" help', "ON"], 2, 1),
        ("set", ["Y", "v(1)", "CACHE", "STRING", "h"], 5, 0),
    ]


def test_load_cmake_options_fixture() -> None:
    opts = S.load_cmake_options(MMA)
    q = opts["GGML_CUDA_FA_QUANTS"]
    assert q.default == q.resolved == "q4_0-q4_0;q8_0-q8_0;f16-f16;bf16-bf16"
    assert (q.kind, q.file, q.line) == ("STRING", "ggml/CMakeLists.txt", 8)
    assert q.help.startswith('ggml: FlashAttention K-V type combinations to compile, "all"')
    assert opts["GGML_HIP_MMQ_MFMA"].default == "ON"
    assert opts["GGML_MULTI_LINE"].help == "ggml: an option() call spread\nover lines"
    assert opts["GGML_MULTI_LINE"].line == 15  # where the call starts
    # variable defaults: the raw expression, plus a value when it can be derived simply
    assert (opts["LLAMA_BUILD_TESTS"].default, opts["LLAMA_BUILD_TESTS"].resolved) == ("${LLAMA_STANDALONE}", "ON")
    assert opts["GGML_BUILD_TESTS"].resolved == "OFF"  # ggml is a subproject in a llama.cpp build
    assert opts["GGML_AVX2"].resolved == "ON"  # one plain set(INS_ENB ON)
    assert opts["GGML_CUDA_GRAPHS"].resolved == "OFF"
    assert opts["GGML_METAL_EMBED_LIBRARY"].resolved == "OFF"  # another option's default
    assert opts["GGML_NATIVE"].resolved is None  # never set in these files
    assert opts["LLAMA_LIB_INSTALL_DIR"].kind == "PATH"
    # declared twice with different defaults inside if/else: first kept, not resolved
    rdma = opts["GGML_RPC_RDMA"]
    assert (rdma.default, rdma.resolved, rdma.conditional) == ("ON", None, True)
    assert rdma.file == "ggml/src/ggml-rpc/CMakeLists.txt"
    assert opts["GGML_RPC_AFTER_IF"].conditional is False
    for skipped in ("CMAKE_BUILD_TYPE", "GGML_OPENMP_ENABLED", "LLAMA_COMMENTED_OUT", "LLAMA_BRACKET_COMMENT"):
        assert skipped not in opts


# ---------------------------------------------------------------- era and commit


def test_find_era() -> None:
    assert T.find_era(MMA) == "mma"
    assert T.find_era(ROCWMMA) == "rocwmma"
    for tree in ("tree_old", "tree_wmma_no_option"):
        with pytest.raises(UsageError) as err:
            T.find_era(DATA / tree)
        msg = str(err.value)
        assert "not supported" in msg and "fattn-wmma-f16.cu" in msg and "GGML_HIP_ROCWMMA_FATTN" in msg
        assert "fattn-mma-f16.cuh" in msg


def test_commit_from_changelog() -> None:
    assert T.find_commit(MMA, changelog=(DATA / "CHANGELOG-0.3.36.md").read_text()) == "0c1e57098"
    # the [Unreleased] section is skipped; full 40-hex hashes are kept whole
    assert (
        T.find_commit(MMA, changelog=(DATA / "CHANGELOG-0.3.16.md").read_text())
        == "4227c9be4268ac844921b90f31595f81236bd317"
    )
    assert T.find_commit(MMA, changelog="## [0.1.0]\n- nothing\n") is None


def test_commit_of_vendor_tree_next_to_sdist_changelog(tmp_path: Path, no_git: None) -> None:
    tree = tmp_path / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp"
    shutil.copytree(MMA, tree)
    shutil.copy(DATA / "CHANGELOG-0.3.36.md", tree.parent.parent / "CHANGELOG.md")
    assert T.find_commit(tree) == "0c1e57098"
    assert T.find_commit(MMA) is None


# ---------------------------------------------------------------- pypi fetch with a fake sdist


def _fake_sdist(path: Path, *, tree: Path = MMA, version: str = "0.3.36", evil: bool = False) -> Path:
    import gzip

    top = f"llama_cpp_python-{version}"
    # Deterministic bytes (gzip mtime 0), like a real sdist downloaded twice: same content, same sha.
    with (
        open(path, "wb") as raw,
        gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w") as tar,
    ):
        tar.add(DATA / f"CHANGELOG-{version}.md", arcname=f"{top}/CHANGELOG.md")
        tar.add(tree, arcname=f"{top}/vendor/llama.cpp")
        tar.add(DATA / "CHANGELOG-0.3.16.md", arcname=f"{top}/docs/not-extracted.md")
        if evil:
            data = b"pwned"
            ti = tarfile.TarInfo(f"{top}/vendor/llama.cpp/../../../evil.txt")
            ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data))
    return path


@pytest.fixture()
def fake_pip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    versions = {"0.3.36": MMA, "0.3.16": ROCWMMA}

    def download(version: str, dest: Path) -> Path:
        calls.append(version)
        dest.mkdir(parents=True, exist_ok=True)
        return _fake_sdist(dest / f"llama_cpp_python-{version}.tar.gz", tree=versions[version], version=version)

    monkeypatch.setattr(F, "run_pip_download", download)
    return calls


def test_fetch_pypi_extracts_vendor_tree_and_caches(
    isolated_home: Path, fake_pip: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    src = S.fetch_source("pypi:llama-cpp-python==0.3.36")
    assert fake_pip == ["0.3.36"] and not src.cached
    assert (src.era, src.commit) == ("mma", "0c1e57098")
    assert src.root == isolated_home / "sources" / src.source_id / "llama.cpp"
    assert (src.root / "ggml/src/ggml-cuda/fattn-mma-f16.cuh").is_file()
    assert not (src.root.parent / "docs").exists() and not (isolated_home / "evil.txt").exists()
    meta = json.loads((src.root.parent / "source.json").read_text())
    assert meta["source_id"] == src.source_id == meta["sdist_sha256"][:16]
    assert meta["spec"] == "pypi:llama-cpp-python==0.3.36" and meta["era"] == "mma" and meta["fetched_at"]
    index = list((isolated_home / "sources" / "specs").glob("*.json"))
    assert [json.loads(p.read_text())["source_id"] for p in index] == [src.source_id]
    assert not list((isolated_home / "sources").glob(".tmp-*"))  # staging cleaned up

    # second fetch of the same SPEC: no pip, no extraction
    monkeypatch.setattr(F, "run_pip_download", _fail)
    monkeypatch.setattr(F, "_extract_vendor_tree", _fail)
    again = S.fetch_source("pypi:llama_cpp_python==0.3.36")
    assert again.cached and (again.source_id, again.root, again.era) == (src.source_id, src.root, "mma")


def test_fetch_pypi_rocwmma_era(isolated_home: Path, fake_pip: list[str]) -> None:
    src = S.fetch_source("pypi:llama-cpp-python==0.3.16")
    assert (src.era, src.commit) == ("rocwmma", "4227c9be4268ac844921b90f31595f81236bd317")


def test_lost_index_reuses_content_addressed_tree(
    isolated_home: Path, fake_pip: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    src = S.fetch_source("pypi:llama-cpp-python==0.3.36")
    shutil.rmtree(isolated_home / "sources" / "specs")
    monkeypatch.setattr(F, "_extract_vendor_tree", _fail)
    again = S.fetch_source("pypi:llama-cpp-python==0.3.36")
    assert fake_pip == ["0.3.36", "0.3.36"] and again.source_id == src.source_id


def test_unsafe_sdist_is_refused_and_leaves_nothing(isolated_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        F, "run_pip_download", lambda v, dest: (dest.mkdir(parents=True), _fake_sdist(dest / "x.tar.gz", evil=True))[1]
    )
    with pytest.raises(TunerError, match="unsafe member path"):
        S.fetch_source()
    sources = isolated_home / "sources"
    assert [p.name for p in sources.iterdir()] == []  # no entry, no staging, no index
    assert not (isolated_home.parent / "evil.txt").exists()


def test_interrupted_extraction_leaves_no_half_tree(
    isolated_home: Path, fake_pip: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(sdist: Path, dest: Path) -> str:
        (dest / "ggml").mkdir(parents=True)  # half written
        raise KeyboardInterrupt

    monkeypatch.setattr(F, "_extract_vendor_tree", boom)
    with pytest.raises(KeyboardInterrupt):
        S.fetch_source()
    assert list((isolated_home / "sources").iterdir()) == []


def test_unsupported_sdist_tree_is_usage_error(isolated_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def download(version: str, dest: Path) -> Path:
        dest.mkdir(parents=True)
        return _fake_sdist(dest / "old.tar.gz", tree=DATA / "tree_old")

    monkeypatch.setattr(F, "run_pip_download", download)
    with pytest.raises(UsageError, match="not supported"):
        S.fetch_source()
    assert list((isolated_home / "sources").iterdir()) == []


def test_run_pip_download_command_and_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def fake_run(cmd: list[str], **kw: object) -> RunResult:
        seen.append([str(c) for c in cmd])
        log_file = kw["log_file"]
        assert isinstance(log_file, Path)
        dest = Path(cmd[cmd.index("-d") + 1])
        if cmd[-1].endswith("==9.9.9"):
            log_file.write_text("ERROR: No matching distribution found for llama-cpp-python==9.9.9\n")
            return RunResult(returncode=1, output="", seconds=0.1, log_file=log_file)
        if cmd[-1].endswith("==0.0.1"):
            log_file.write_text("ERROR: network is unreachable\n")
            return RunResult(returncode=1, output="", seconds=0.1, log_file=log_file)
        (dest / "llama_cpp_python-0.3.36.tar.gz").write_bytes(b"x")
        return RunResult(returncode=0, output="", seconds=0.1, log_file=log_file)

    for mod in (F, T):
        monkeypatch.setattr(mod, "run", fake_run)
    out = F.run_pip_download("0.3.36", tmp_path / "a")
    assert out == tmp_path / "a" / "llama_cpp_python-0.3.36.tar.gz"
    cmd = seen[0]
    assert cmd[:4] == [sys.executable, "-m", "pip", "download"]
    for flag in ("--no-deps", "--no-build-isolation"):
        assert flag in cmd
    assert cmd[cmd.index("--no-binary") + 1] == ":all:" and cmd[-1] == "llama-cpp-python==0.3.36"
    with pytest.raises(UsageError, match="no sdist of llama-cpp-python==9.9.9"):
        F.run_pip_download("9.9.9", tmp_path / "b")
    with pytest.raises(TunerError, match="network is unreachable") as err:
        F.run_pip_download("0.0.1", tmp_path / "c")
    assert not isinstance(err.value, UsageError)


# ---------------------------------------------------------------- path sources


def test_path_source_id_tracks_build_relevant_files(tmp_path: Path, no_git: None, isolated_home: Path) -> None:
    tree = tmp_path / "llama.cpp"
    shutil.copytree(MMA, tree)
    a = S.fetch_source(f"path:{tree}")
    assert (a.root, a.era, a.commit, a.spec) == (tree, "mma", None, f"path:{tree}")
    assert len(a.source_id) == 16
    (tree / "docs" / "build.md").write_text("docs do not change the build\n")
    assert S.fetch_source(f"path:{tree}").source_id == a.source_id
    (tree / "ggml/src/ggml-cuda/fattn.cu").write_text("// patched\n")
    assert S.fetch_source(f"path:{tree}").source_id != a.source_id
    assert not (isolated_home / "sources").exists() or not list((isolated_home / "sources").iterdir())


def test_path_source_in_git_uses_head_and_diff(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = tmp_path / "llama.cpp"
    shutil.copytree(MMA, tree)
    diff = {"text": ""}

    def fake_run(cmd: list[str], **kw: object) -> RunResult:
        args = cmd[3:]
        out = {
            ("rev-parse", "--show-toplevel"): f"{tree}\n",
            ("rev-parse", "HEAD"): "a" * 40 + "\n",
            ("diff", "HEAD", "--binary"): diff["text"],
            ("ls-files", "--others", "--exclude-standard"): "",
        }[tuple(args)]
        return RunResult(returncode=0, output=out, seconds=0.0)

    for mod in (F, T):
        monkeypatch.setattr(mod, "run", fake_run)
    a = S.fetch_source(f"path:{tree}")
    assert a.commit == "a" * 40
    diff["text"] = "--- a/x\n+++ b/x\n"
    assert S.fetch_source(f"path:{tree}").source_id != a.source_id


# ---------------------------------------------------------------- info and pack


def _src(root: Path, era: str) -> S.Source:
    return S.Source(spec=f"path:{root}", source_id="0" * 16, root=root, commit=None, era=era)


def test_source_info_mma_fixture() -> None:
    info = S.source_info(_src(MMA, "mma"))
    assert info["fa_kernels"] == {"VEC": True, "TILE": True, "MMA": True, "WMMA": False}
    assert info["config_tables"]["tile"]["rows"] == {"nvidia_fp16": 3, "amd_rdna": 1}
    assert info["config_tables"]["mma"]["rows"] == {"ampere": 2, "turing": 1}
    assert info["fa_instances"] == {"fattn-mma-f16": 3, "fattn-tile": 1, "fattn-vec": 2}
    assert info["tools"] == {"llama-bench": True, "test-backend-ops": True, "llama-quantize": False}
    assert info["options"]["GGML_HIP_MMQ_MFMA"] == {
        "default": "ON",
        "resolved": "ON",
        "help": "ggml: enable MFMA MMA for CDNA in MMQ",
        "kind": "BOOL",
        "file": "ggml/CMakeLists.txt",
        "line": 11,
        "conditional": False,
    }
    assert "GGML_HIP_ROCWMMA_FATTN" not in info["options"]
    json.dumps(info)  # what --json prints


def test_source_info_rocwmma_fixture() -> None:
    info = S.source_info(_src(ROCWMMA, "rocwmma"))
    assert info["fa_kernels"]["WMMA"] and info["fa_kernels"]["TILE"]
    assert info["config_tables"]["mma_f16_config"]["specializations"] == ["64x64", "576x512"]
    assert info["config_tables"]["wmma"]["files"] == [
        "ggml/src/ggml-cuda/fattn-wmma-f16.cu",
        "ggml/src/ggml-cuda/fattn-wmma-f16.cuh",
    ]
    assert info["fa_instances"] == {"fattn-mma-f16": 1, "fattn-vec-f16": 1, "fattn-vec-f32": 1}
    assert info["options"]["GGML_HIP_ROCWMMA_FATTN"]["default"] == "OFF"
    assert "GGML_CUDA_F16" in info["options"]


def test_pack_source_trims(tmp_path: Path) -> None:
    out = S.pack_source(_src(MMA, "mma"), tmp_path / "sub" / "pack.tar.gz")
    with tarfile.open(out) as tar:
        names = set(tar.getnames())
        assert all(m.uid == 0 and m.uname == "" for m in tar.getmembers())
    assert "llama.cpp/ggml/src/ggml-cuda/fattn-mma-f16.cuh" in names
    assert "llama.cpp/ggml/src/ggml-rpc/CMakeLists.txt" in names
    assert "llama.cpp/ggml/src/ggml.c" in names and "llama.cpp/ggml/src/ggml-version.h.in" in names
    assert "llama.cpp/models/ggml-vocab-llama-bpe.gguf" in names
    for gone in (
        "ggml/src/ggml-vulkan/ggml-vulkan.cpp",
        "models/ggml-vocab-gpt-2.gguf",
        "docs/build.md",
        "tools/ui/index.html",
        "tools/server/public/index.html",
    ):
        assert f"llama.cpp/{gone}" not in names
    assert "llama.cpp/tools/llama-bench/llama-bench.cpp" in names
    full = S.pack_source(_src(MMA, "mma"), tmp_path / "full.tar.gz", trim=False)
    with tarfile.open(full) as tar:
        assert "llama.cpp/docs/build.md" in tar.getnames()
    assert not list(tmp_path.glob("**/.*.tmp"))


# ---------------------------------------------------------------- CLI


def test_cli_info_json_and_fetch(no_git: None, isolated_home: Path) -> None:
    from tuner.cli import cli

    runner = CliRunner()
    res = runner.invoke(cli, ["source", "info", f"path:{ROCWMMA}", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["era"] == "rocwmma" and "GGML_HIP_ROCWMMA_FATTN" in data["options"]
    res = runner.invoke(cli, ["source", "info", f"path:{MMA}"])
    assert res.exit_code == 0 and "era:        mma" in res.stdout and "| nvidia_fp16 | 3" in res.stdout
    res = runner.invoke(cli, ["source", "fetch", f"path:{MMA}"])
    assert res.exit_code == 0 and res.stdout.strip() == str(MMA.resolve())


def test_cli_bad_spec_exit_2(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from tuner.cli import main

    monkeypatch.setattr(sys, "argv", ["tuner", "source", "info", "pypi:llama-cpp-python>=0.3"])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("tuner: error: SPEC 'pypi:llama-cpp-python>=0.3' is not pinned") and "Traceback" not in err


def test_cli_pack(tmp_path: Path, no_git: None) -> None:
    from tuner.cli import cli

    out = tmp_path / "t.tar.gz"
    res = CliRunner().invoke(cli, ["source", "pack", f"path:{MMA}", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == str(out) and tarfile.is_tarfile(out)


def test_sha256_helper(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"abc" * 100000)
    from tuner._hash import file_sha256

    assert file_sha256(p) == hashlib.sha256(b"abc" * 100000).hexdigest()


def test_pack_then_unpack_registers_same_spec_and_id(
    isolated_home: Path, fake_pip: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tuner.source import fetch_source, pack_source, unpack_source

    src = fetch_source("pypi:llama-cpp-python==0.3.36")
    archive = pack_source(src, tmp_path / "carry.tgz", trim=False)
    other = tmp_path / "other-home"
    monkeypatch.setenv("TUNER_HOME", str(other))
    got = unpack_source(archive)
    assert (got.source_id, got.era, got.commit) == (src.source_id, src.era, src.commit)
    # The packed SPEC now resolves on the "other machine" without pip.
    monkeypatch.setattr("tuner.source.fetch.run_pip_download", _fail)
    again = fetch_source("pypi:llama-cpp-python==0.3.36")
    assert again.cached and again.source_id == src.source_id and again.root == got.root
    with pytest.raises(UsageError):
        unpack_source(tmp_path / "missing.tgz")
