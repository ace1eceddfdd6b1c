"""tuner.builder.carry: a build packed on one machine and installed on another, and the packs it refuses.

The files are fakes (no compiler runs); tests/integration/test_build_carry_cpu.py carries a real build.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from tuner.builder import carry
from tuner.builder.cmake import ensure_targets
from tuner.builder.records import cached_record
from tuner.errors import UsageError
from tuner.plan.variant import Build, RenderedVariant

TOY = Path(__file__).resolve().parents[2] / "data" / "build" / "toy"


def make_rv(tile: str = "64") -> RenderedVariant:
    return RenderedVariant(
        arch="cpu",
        variant="toy",
        era="mma",
        source_id="0123456789abcdef",
        source_root=TOY,
        defines={"TOY_TILE": tile},
        patch="hook",
        files={},
    )


def fake_build(home: Path, rv: RenderedVariant) -> Build:
    """What build_variant leaves: the artifact's bin/ (an executable, a library and its soname link),
    its build.json, and the tree's ggml headers."""
    root = home / "builds" / rv.key
    art = root / "artifacts" / rv.artifact_key
    (art / "bin").mkdir(parents=True)
    exe = art / "bin" / "llama-bench"
    exe.write_bytes(b"#!/bin/sh\necho carried\n")
    exe.chmod(0o755)
    (art / "bin" / "libggml.so.0").write_bytes(b"\x7fELF library bytes")
    os.symlink("libggml.so.0", art / "bin" / "libggml.so")
    record = {"build_id": "built-there", "key": rv.key, "artifact_key": rv.artifact_key, "status": "ok"}
    record |= {"targets": ["llama-bench"], "log": "/there/build.log"}
    (art / "build.json").write_text(json.dumps(record))
    inc = root / "src" / "ggml" / "include"
    inc.mkdir(parents=True)
    (inc / "ggml.h").write_text("// ggml.h\n")
    return Build(
        build_id="built-there", build_dir=root / "build", bin_dir=art / "bin", log_file=art, cached=False, seconds=1
    )


@pytest.fixture()
def packed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A pack written on machine A ($TUNER_HOME a/); the test then runs on machine B (b/)."""
    rv = make_rv()
    monkeypatch.setenv("TUNER_HOME", str(tmp_path / "a"))
    out = carry.pack_build(fake_build(tmp_path / "a", rv), rv, tmp_path / "sm.tar.xz", spec="pypi:x==1")
    monkeypatch.setenv("TUNER_HOME", str(tmp_path / "b"))
    return out


def test_round_trip_installs_the_build_as_cached(packed: Path, tmp_path: Path) -> None:
    rv = make_rv()
    b = carry.unpack_build(packed, rv)
    home_b = tmp_path / "b"
    assert b.bin_dir == (home_b / "builds" / rv.key / "artifacts" / rv.artifact_key).resolve() / "bin"
    assert (b.bin_dir / "llama-bench").read_bytes() == b"#!/bin/sh\necho carried\n"
    assert os.access(b.bin_dir / "llama-bench", os.X_OK) and not os.access(b.bin_dir / "libggml.so.0", os.X_OK)
    assert os.readlink(b.bin_dir / "libggml.so") == "libggml.so.0"
    # fa-bench finds the headers where a local build keeps its tree
    assert (home_b / "builds" / rv.key / "src" / "ggml" / "include" / "ggml.h").read_text() == "// ggml.h\n"
    rec = json.loads((b.bin_dir.parent / "build.json").read_text())
    assert rec["carried"]["pack"] == "sm.tar.xz" and rec["build_id"] == "built-there" and "log" not in rec
    # this machine's toolchain gives another build id; the carried artifact still stands for the variant
    assert cached_record(b.bin_dir.parent, "built-here", ["llama-bench"]) is not None
    assert cached_record(b.bin_dir.parent, "built-here", ["llama-bench", "llama-perplexity"]) is None


def test_uncarried_record_of_another_toolchain_is_not_cached(tmp_path: Path) -> None:
    rv = make_rv()
    b = fake_build(tmp_path, rv)
    assert cached_record(b.bin_dir.parent, "built-there", ["llama-bench"]) is not None
    assert cached_record(b.bin_dir.parent, "built-here", ["llama-bench"]) is None


def test_carried_build_missing_a_target_names_the_repack(packed: Path) -> None:
    b = carry.unpack_build(packed, make_rv())
    with pytest.raises(UsageError, match=r"carried from another machine.*llama-perplexity.*--pack FILE"):
        ensure_targets(b, ["llama-bench", "llama-perplexity"])


def test_other_variant_is_refused_with_what_differs(packed: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"not a build of cpu/toy.*flags, hooks or knob values differ"):
        carry.unpack_build(packed, make_rv(tile="128"))
    assert not (tmp_path / "b" / "builds").exists()


def _rewrite(src: Path, dst: Path, edit) -> Path:
    """Copy a pack entry by entry; ``edit(info, data)`` returns the (info, data) to write or None to drop."""
    with tarfile.open(src, "r:*") as tin, tarfile.open(dst, "w:xz") as tout:
        for m in tin.getmembers():
            data = tin.extractfile(m).read() if m.isfile() else None
            got = edit(m, data)
            if got is None:
                continue
            info, data = got
            if data is not None:
                info.size = len(data)
            tout.addfile(info, io.BytesIO(data) if data is not None else None)
    return dst


def test_damaged_file_is_refused(packed: Path, tmp_path: Path) -> None:
    def edit(m, data):
        return (m, b"#!/bin/sh\necho other\n") if m.name == "bin/llama-bench" else (m, data)

    bad = _rewrite(packed, tmp_path / "bad.tar.xz", edit)
    with pytest.raises(UsageError, match=r"bin/llama-bench does not match the sha256"):
        carry.unpack_build(bad, make_rv())
    rv = make_rv()
    assert not (tmp_path / "b" / "builds" / rv.key / "artifacts" / rv.artifact_key).exists()


def test_other_machine_is_refused(packed: Path, tmp_path: Path) -> None:
    def edit(m, data):
        if m.name != "build-pack.json":
            return m, data
        man = json.loads(data)
        man["machine"] = "riscv64"
        return m, json.dumps(man).encode()

    with pytest.raises(UsageError, match=r"built for \w+ riscv64, this machine is"):
        carry.unpack_build(_rewrite(packed, tmp_path / "rv.tar.xz", edit), make_rv())


def test_a_native_build_from_a_cpu_with_other_features_is_refused(
    packed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # make_rv has no GGML_NATIVE define: a -march=native build, whose binaries die of SIGILL on another CPU
    from tuner.builder import records

    monkeypatch.setattr(records, "host_isa", lambda: "x86_64-othercpu")
    with pytest.raises(UsageError, match=r"-march=native build .* other instruction-set features.*SIGILL"):
        carry.unpack_build(packed, make_rv())
    assert not (tmp_path / "b" / "builds").exists()


@pytest.mark.parametrize(
    ("name", "kind", "link", "why"),
    [
        ("../escape", tarfile.REGTYPE, "", "is not bin/NAME"),
        ("bin/../../escape", tarfile.REGTYPE, "", "is not bin/NAME"),
        ("/etc/cron.d/x", tarfile.REGTYPE, "", "is not bin/NAME"),
        ("lib/x.so", tarfile.REGTYPE, "", "is not bin/NAME"),
        ("bin/passwd", tarfile.SYMTYPE, "/etc/passwd", "outside bin/"),
        ("bin/up", tarfile.SYMTYPE, "../../x", "outside bin/"),
        ("include/x.cpp", tarfile.REGTYPE, "", "not a header file"),
        ("bin/dev", tarfile.CHRTYPE, "", "neither a file nor a link"),
    ],
)
def test_entries_outside_the_pack_layout_are_refused(
    packed: Path, tmp_path: Path, name: str, kind: bytes, link: str, why: str
) -> None:
    def edit(m, data):
        return m, data

    bad = _rewrite(packed, tmp_path / "evil.tar.xz", edit)
    with tarfile.open(bad, "r:xz") as tin:
        members = [(m, tin.extractfile(m).read() if m.isfile() else None) for m in tin.getmembers()]
    with tarfile.open(bad, "w:xz") as tout:
        for m, data in members:
            tout.addfile(m, io.BytesIO(data) if data is not None else None)
        extra = tarfile.TarInfo(name)
        extra.type, extra.linkname = kind, link
        tout.addfile(extra, io.BytesIO(b"") if kind == tarfile.REGTYPE else None)
    with pytest.raises(UsageError, match=why):
        carry.unpack_build(bad, make_rv())
    assert not (tmp_path / "b" / "builds").exists() and not (tmp_path / "escape").exists()


def test_cut_short_and_missing_packs_say_so(packed: Path, tmp_path: Path) -> None:
    short = tmp_path / "short.tar.xz"
    short.write_bytes(packed.read_bytes()[: packed.stat().st_size // 2])
    with pytest.raises(UsageError, match="cut short"):
        carry.unpack_build(short, make_rv())
    with pytest.raises(UsageError, match=r"does not exist.*--pack FILE"):
        carry.unpack_build(tmp_path / "none.tar.xz", make_rv())
