"""`tuner source unpack` with hostile or broken packs: every one exits 2 with one paragraph and writes
nothing outside $TUNER_HOME/sources (and nothing lasting inside it); a valid pack round-trips.

Each case goes through ``tuner.cli:main``, so an unexpected exception would show as exit 70."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tuner import source as S
from tuner.source import fetch as F

DATA = Path(__file__).resolve().parents[2] / "data" / "source"
MMA = DATA / "tree_mma"
SPEC = "pypi:llama-cpp-python==0.3.36"
SHA_A = hashlib.sha256(b"sdist a").hexdigest()
SHA_B = hashlib.sha256(b"sdist b").hexdigest()


def _pypi_source(sha: str = SHA_A) -> S.Source:
    return S.Source(
        spec=SPEC,
        source_id=sha[:16],
        root=MMA,
        commit="0c1e57098",
        era="mma",
        meta={"sdist": "llama_cpp_python-0.3.36.tar.gz", "sdist_sha256": sha},
    )


@pytest.fixture()
def valid_pack(tmp_path: Path) -> Path:
    return S.pack_source(_pypi_source(), tmp_path / "packs" / "valid.tgz")


def _members(pack: Path) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    with tarfile.open(pack, "r:gz") as tar:
        return [(m, tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()]  # type: ignore[union-attr]


def _meta(pack: Path) -> dict[str, object]:
    return json.loads(dict((m.name, d) for m, d in _members(pack))["source.json"] or b"")


def _entry(
    name: str, data: bytes | None = None, *, kind: bytes = tarfile.REGTYPE, link: str = ""
) -> tuple[tarfile.TarInfo, bytes | None]:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.linkname = link
    ti.size = len(data) if data is not None else 0
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        ti.devmajor, ti.devminor = 1, 3
    return ti, data


def _craft(
    valid: Path,
    out: Path,
    *,
    meta: dict[str, object] | bytes | None = None,
    edit: Callable[[dict[str, object]], None] | None = None,
    add: list[tuple[tarfile.TarInfo, bytes | None]] = (),  # type: ignore[assignment]
    drop: Callable[[str], bool] = lambda name: False,
    data: Callable[[str, bytes], bytes] = lambda name, b: b,
) -> Path:
    """A copy of ``valid`` with source.json replaced (``meta``) or edited, entries added or dropped."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w:gz") as tar:
        for m, blob in _members(valid):
            if drop(m.name):
                continue
            if m.name == "source.json":
                if isinstance(meta, bytes):
                    blob = meta
                else:
                    record = dict(meta) if meta is not None else json.loads(blob or b"")
                    if edit:
                        edit(record)
                    blob = json.dumps(record).encode()
                m.size = len(blob)
            elif blob is not None:
                blob = data(m.name, blob)
                m.size = len(blob)
            tar.addfile(m, io.BytesIO(blob) if blob is not None else None)
        for m, blob in add:
            tar.addfile(m, io.BytesIO(blob) if blob is not None else None)
    return out


def _tuner(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from tuner.cli import main

    monkeypatch.setattr(sys, "argv", ["tuner", *args])
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def _snapshot(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


def _assert_refused(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    pack: Path,
    *words: str,
    replace: bool = False,
) -> str:
    """``tuner source unpack PACK`` exits 2 with one paragraph holding ``words`` and changes no file
    anywhere under tmp_path (which holds TUNER_HOME, the packs and where escapes would land)."""
    (tmp_path / "home" / "sources").mkdir(parents=True, exist_ok=True)  # the one thing unpack may create
    before = _snapshot(tmp_path)
    code, out, err = _tuner(monkeypatch, capsys, "source", "unpack", *(["--replace"] if replace else []), str(pack))
    assert code == 2, err
    assert err.startswith("tuner: error: ") and "Traceback" not in err and err.count("\n") == 1, err
    for w in words:
        assert w in err, err
    assert out == ""
    assert _snapshot(tmp_path) == before
    assert not Path("/tmp/escaped-by-tuner-pack").exists() and not Path("/escaped").exists()
    return err


HOSTILE_ENTRIES = {
    "dotdot": (_entry("llama.cpp/../../../../evil.txt", b"pwned"), "absolute or '..' path"),
    "dotdot-top": (_entry("../evil.txt", b"pwned"), "absolute or '..' path"),
    "absolute": (_entry("/tmp/escaped-by-tuner-pack", b"pwned"), "absolute or '..' path"),
    "symlink": (_entry("llama.cpp/ggml/link", kind=tarfile.SYMTYPE, link="../../../../../"), "is a symlink"),
    "symlink-abs": (_entry("llama.cpp/abs", kind=tarfile.SYMTYPE, link="/etc"), "is a symlink"),
    "hardlink": (_entry("llama.cpp/hard", kind=tarfile.LNKTYPE, link="llama.cpp/CMakeLists.txt"), "is a hard link"),
    "device": (_entry("llama.cpp/null", kind=tarfile.CHRTYPE), "is a device file"),
    "fifo": (_entry("llama.cpp/fifo", kind=tarfile.FIFOTYPE), "is a FIFO"),
    "outside-tree": (_entry("docs/x.md", b"x"), "outside llama.cpp/"),
    "duplicate": (_entry("llama.cpp/CMakeLists.txt", b"other"), "appears twice"),
    "under-a-file": (_entry("llama.cpp/CMakeLists.txt/x", b"x"), "which is a file"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_ENTRIES))
def test_hostile_entries_are_refused(
    case: str,
    valid_pack: Path,
    isolated_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    entry, words = HOSTILE_ENTRIES[case]
    pack = _craft(valid_pack, tmp_path / "packs" / f"{case}.tgz", add=[entry])
    _assert_refused(monkeypatch, capsys, tmp_path, pack, str(pack), words, "tuner source pack")


def test_symlinked_source_json_is_refused(
    valid_pack: Path,
    isolated_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    link = _entry("source.json", kind=tarfile.SYMTYPE, link="llama.cpp/CMakeLists.txt")
    pack = _craft(valid_pack, tmp_path / "packs" / "link.tgz", drop=lambda n: n == "source.json", add=[link])
    _assert_refused(monkeypatch, capsys, tmp_path, pack, "'source.json' is a symlink")


BAD_META: dict[str, tuple[Callable[[dict[str, object]], None] | bytes, str]] = {
    "path-like-id": (lambda m: m.update(source_id="../../escaped"), "is not a content id"),
    "absolute-id": (lambda m: m.update(source_id="/tmp/escaped-by-tuner-pack"), "is not a content id"),
    "id-not-of-sdist": (lambda m: m.update(source_id=SHA_B[:16]), "not the sdist's content id"),
    "bad-spec": (lambda m: m.update(spec="pypi:llama-cpp-python>=0.3"), "is not pinned"),
    "spec-with-path": (lambda m: m.update(spec="path:../../x"), "absolute path"),
    "missing-keys": (lambda m: m.pop("source_id"), "lacks source_id"),
    "old-pack": (lambda m: m.pop("tree_sha256"), "written by an older tuner"),
    "wrong-type": (lambda m: m.update(trimmed="yes"), "'trimmed' is str"),
    "nested-value": (lambda m: m.update(extra={"a": 1}), "'extra' is dict"),
    "bad-era": (lambda m: m.update(era="future"), "era 'future'"),
    "other-era": (lambda m: m.update(era="rocwmma"), "says era 'rocwmma'"),
    "bad-commit": (lambda m: m.update(commit="$(rm -rf ~)"), "is not a git commit"),
    "bad-digest": (lambda m: m.update(tree_sha256="0" * 64), "do not match the tree_sha256"),
    "bad-json": (b"{not json", "not valid JSON"),
    "not-utf8": (b"\xff\xfe{}", "not valid JSON"),
    "json-array": (b"[1, 2]", "not a JSON object"),
}


@pytest.mark.parametrize("case", sorted(BAD_META))
def test_bad_source_json_is_refused(
    case: str,
    valid_pack: Path,
    isolated_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    change, words = BAD_META[case]
    out = tmp_path / "packs" / f"{case}.tgz"
    pack = _craft(valid_pack, out, meta=change) if isinstance(change, bytes) else _craft(valid_pack, out, edit=change)
    _assert_refused(monkeypatch, capsys, tmp_path, pack, words)


def test_tampered_tree_is_refused(
    valid_pack: Path,
    isolated_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pack = _craft(
        valid_pack,
        tmp_path / "packs" / "tampered.tgz",
        data=lambda name, b: b + b"\n// injected" if name.endswith("fattn-mma-f16.cuh") else b,
    )
    _assert_refused(monkeypatch, capsys, tmp_path, pack, "do not match the tree_sha256")


def test_not_a_tar_gz_is_refused(
    valid_pack: Path,
    isolated_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = tmp_path / "packs" / "text.tgz"
    text.write_bytes(b"this is not a gzip file\n")
    _assert_refused(monkeypatch, capsys, tmp_path, text, "not a readable tar.gz")
    plain = tmp_path / "packs" / "plain.tar"
    plain.write_bytes(gzip.decompress(valid_pack.read_bytes()))  # a tar, not gzipped
    _assert_refused(monkeypatch, capsys, tmp_path, plain, "not a readable tar.gz")
    cut = tmp_path / "packs" / "cut.tgz"
    cut.write_bytes(valid_pack.read_bytes()[: valid_pack.stat().st_size // 2])
    _assert_refused(monkeypatch, capsys, tmp_path, cut, "not a readable tar.gz")
    garbage = tmp_path / "packs" / "garbage.tgz"
    garbage.write_bytes(gzip.compress(b"\x00garbage" * 1000))
    _assert_refused(monkeypatch, capsys, tmp_path, garbage)
    empty = tmp_path / "packs" / "no-tree.tgz"
    _craft(valid_pack, empty, drop=lambda n: n.startswith("llama.cpp/"))
    _assert_refused(monkeypatch, capsys, tmp_path, empty, "no source.json and llama.cpp/")


def test_pack_cannot_repoint_a_spec_without_replace(
    valid_pack: Path,
    isolated_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = _tuner(monkeypatch, capsys, "source", "unpack", str(valid_pack))
    assert code == 0, err
    root_a = out.strip()
    # Same SPEC, a self-consistent record for another sdist: the poisoned pack.
    poison = _craft(
        valid_pack, tmp_path / "packs" / "poison.tgz", edit=lambda m: m.update(source_id=SHA_B[:16], sdist_sha256=SHA_B)
    )
    _assert_refused(
        monkeypatch, capsys, tmp_path, poison, f"would re-point {SPEC} from source {SHA_A[:16]}", "--replace"
    )
    monkeypatch.setattr(F, "run_pip_download", lambda *a: pytest.fail("must not download"))
    assert str(S.fetch_source(SPEC).root) == root_a  # the SPEC still builds the tree it had
    code, out, err = _tuner(monkeypatch, capsys, "source", "unpack", "--replace", str(poison))
    assert code == 0, err
    assert S.fetch_source(SPEC).source_id == SHA_B[:16] == Path(out.strip()).parent.name


def test_pack_cannot_claim_an_existing_tree_for_another_release(
    valid_pack: Path,
    isolated_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _tuner(monkeypatch, capsys, "source", "unpack", str(valid_pack))[0] == 0
    other = _craft(
        valid_pack, tmp_path / "packs" / "other.tgz", edit=lambda m: m.update(spec="pypi:llama-cpp-python==0.3.16")
    )
    _assert_refused(monkeypatch, capsys, tmp_path, other, f"source {SHA_A[:16]} is {SPEC} on this machine")


def test_valid_pack_round_trips_and_is_idempotent(
    valid_pack: Path,
    isolated_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    meta = _meta(valid_pack)
    assert meta["source_id"] == SHA_A[:16] and isinstance(meta["tree_sha256"], str)
    code, out, err = _tuner(monkeypatch, capsys, "source", "unpack", str(valid_pack))
    assert code == 0, err
    root = Path(out.strip())
    assert root == isolated_home / "sources" / SHA_A[:16] / "llama.cpp"
    assert (root / "ggml/src/ggml-cuda/fattn-mma-f16.cuh").read_bytes() == (
        MMA / "ggml/src/ggml-cuda/fattn-mma-f16.cuh"
    ).read_bytes()
    monkeypatch.setattr(F, "run_pip_download", lambda *a: pytest.fail("must not download"))
    src = S.fetch_source(SPEC)
    assert (src.cached, src.root, src.era, src.commit) == (True, root, "mma", "0c1e57098")
    before = _snapshot(isolated_home)
    code, out, err = _tuner(monkeypatch, capsys, "source", "unpack", str(valid_pack))
    assert code == 0 and Path(out.strip()) == root, err
    assert _snapshot(isolated_home) == before  # no staging left, nothing new
    # and the unpacked tree packs again into a pack that unpacks elsewhere
    again = S.pack_source(src, tmp_path / "packs" / "again.tgz")
    assert _meta(again)["tree_sha256"] == meta["tree_sha256"]
    monkeypatch.setenv("TUNER_HOME", str(tmp_path / "third"))
    assert S.unpack_source(again).source_id == SHA_A[:16]


def test_path_pack_registers_the_tree_but_no_spec(
    isolated_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    src = S.Source(spec=f"path:{MMA}", source_id="0123456789abcdef", root=MMA, commit=None, era="mma")
    pack = S.pack_source(src, tmp_path / "packs" / "path.tgz", trim=False)
    code, out, err = _tuner(monkeypatch, capsys, "source", "unpack", str(pack))
    assert code == 0, err
    assert Path(out.strip()) == isolated_home / "sources" / "0123456789abcdef" / "llama.cpp"
    assert not (isolated_home / "sources" / "specs").exists()  # fetch_source never reads an index for path:


def test_unpack_disk_full_is_exit_1_naming_the_path(
    valid_pack: Path,
    isolated_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import errno

    def full(self: tarfile.TarFile, path: str, **kw: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", f"{path}/llama.cpp/ggml/x.c")

    monkeypatch.setattr(tarfile.TarFile, "extractall", full)
    code, _, err = _tuner(monkeypatch, capsys, "source", "unpack", str(valid_pack))
    assert code == 1 and "No space left on device while writing " in err and "/llama.cpp/ggml/x.c" in err
    assert "Traceback" not in err
    assert [p.name for p in (isolated_home / "sources").iterdir()] == []
