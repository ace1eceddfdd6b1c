"""What an export writes, and that it writes it whole: from the real H100 study databases the stored results were
exported from (results/*/evidence/study.db.xz).

sm89-l1b-v4 confirmed nothing (its kernels are upstream's); sm90-l1b-v3 kept one decode rule.
"""

from __future__ import annotations

import errno
import hashlib
import lzma
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.cli.export_cmd import export_study
from tuner.errors import UsageError
from tuner.result.export import NO_PATCH_NOTE, PRESETS_FILE

ROOT = Path(__file__).resolve().parents[3]
UPSTREAM = (
    "sm89-l1b-v4",
    ROOT / "results" / "sm_89" / "llama-3.2-1b-q4_k_m-measured-on-h100" / "evidence" / "study.db.xz",
)
RULE = ("sm90-l1b-v3", ROOT / "results" / "sm_90" / "llama-3.2-1b-q4_k_m" / "evidence" / "study.db.xz")


def _export(study: tuple[str, Path], tmp_path: Path, out: Path | None = None) -> Path:
    db = tmp_path / f"{study[0]}.db"
    if not db.exists():  # a copy: the export must not depend on where the study lives
        db.write_bytes(lzma.decompress(study[1].read_bytes()))
    return export_study(study[0], storage=f"sqlite:///{db}", out_dir=out or tmp_path / "out")


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_upstream_kernels_export_no_patch_and_say_so(tmp_path: Path) -> None:
    from tuner.result.validate import validate_result

    out = _export(UPSTREAM, tmp_path)
    files = {p.name for p in out.iterdir()}
    assert "tuned.patch" not in files and "CMakePresets.json" not in files and PRESETS_FILE in files
    assert NO_PATCH_NOTE in (out / "report.md").read_text()
    check = validate_result(out)
    assert check.ok, [f for f in check.findings if not f.ok]
    # An empty tuned.patch (what exports wrote before) is rejected: `git apply` exits 128 on it.
    (out / "tuned.patch").write_text("")
    assert not validate_result(out).ok


def test_rule_export_patch_applies_and_stays_inside_llama_cpp(tmp_path: Path) -> None:
    from tuner.result.upstream_patch import whitespace_only_hunks
    from tuner.result.validate import git_apply_to_copy
    from tuner.source import fetch_source

    out = _export(RULE, tmp_path)
    patch = (out / "tuned.patch").read_text()
    assert "decode/D64/gqa4/kvf16:32768-=TILE" in patch
    assert whitespace_only_hunks(patch) == []
    # Comments may cite llama.cpp's own files, never tuner's docs or templates.
    assert not re.search(r"knobs\.md|docs/|templates/|\.j2\b|design\.md", patch)
    res, _ = git_apply_to_copy(out / "tuned.patch", fetch_source("pypi:llama-cpp-python==0.3.36").root)
    assert res.returncode == 0, res.output


def test_export_names_no_local_path(tmp_path: Path) -> None:
    out = _export(RULE, tmp_path)
    for f in out.iterdir():
        if f.suffix in (".toml", ".md", ".env", ".patch", ".json"):
            text = f.read_text()
            # The study lived on another machine (/work/...) and its copy here in tmp_path: neither may show.
            assert str(tmp_path) not in text and "/work/" not in text and "sqlite:////" not in text, f.name
    cfg = (out / "config.toml").read_text()
    assert 'log = "logs/check-MMA.log"' in cfg  # the op check's log, relative to the run folder


def test_failed_export_leaves_the_previous_one_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = _export(RULE, tmp_path)
    before = _digest(out)
    real = Path.write_text

    def full_disk(self: Path, *a: object, **k: object) -> int:
        if self.name == "report.md":  # after config.toml, run.env and the plots: mid-export
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(OSError) as exc:
        _export(UPSTREAM, tmp_path, out)  # a different study: every file would change
    assert exc.value.errno == errno.ENOSPC
    assert _digest(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["out", f"{RULE[0]}.db", f"{UPSTREAM[0]}.db"]
    )  # no temp folder
    monkeypatch.setattr(Path, "write_text", real)
    _export(UPSTREAM, tmp_path, out)  # a good export replaces it whole: nothing of the old one stays
    assert "tuned.patch" not in {p.name for p in out.iterdir()}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out", f"{RULE[0]}.db", f"{UPSTREAM[0]}.db"])


def _tmpfs_ok(d: Path) -> bool:
    if not shutil.which("unshare"):
        return False
    res = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {d}"], capture_output=True)
    return res.returncode == 0


def test_full_tmpfs_export_leaves_the_previous_one_whole(tmp_path: Path) -> None:
    """A real full disk: a 1 MiB tmpfs in a private mount namespace (unshare -rm, no root needed where user
    namespaces are allowed), filled so the second export runs out of space part-way."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if not _tmpfs_ok(mnt):
        pytest.skip("no private tmpfs here (unshare -rm + mount -t tmpfs refused); the injected ENOSPC test covers it")
    db = tmp_path / f"{RULE[0]}.db"
    db.write_bytes(lzma.decompress(RULE[1].read_bytes()))
    code = f"""
import hashlib, os, sys
from pathlib import Path
from tuner.cli.export_cmd import export_study
out = Path({str(mnt / "out")!r})
export_study({RULE[0]!r}, storage={"sqlite:///" + str(db)!r}, out_dir=out)
before = {{p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.iterdir()}}
st = os.statvfs(out)
with open(out.parent / "filler", "wb") as f:  # leave 24 KiB: config.toml fits, the plots do not
    f.write(b"x" * max(0, st.f_bavail * st.f_frsize - 24 * 1024))
try:
    export_study({RULE[0]!r}, storage={"sqlite:///" + str(db)!r}, out_dir=out)
except OSError as err:
    print("errno", err.errno)
after = {{p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.iterdir()}}
print("same", before == after, "left", sorted(p.name for p in out.parent.iterdir()))
"""
    res = subprocess.run(
        [
            "unshare",
            "-rm",
            "sh",
            "-c",
            f'mount -t tmpfs -o size=1m tmpfs {mnt} && exec "$0" -c "$1"',
            sys.executable,
            code,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"errno {errno.ENOSPC}" in res.stdout, res.stdout + res.stderr[-2000:]
    assert "same True left ['filler', 'out']" in res.stdout, res.stdout


def test_llama_cpp_tree_or_foreign_folder_is_refused(tmp_path: Path) -> None:
    tree = tmp_path / "llama.cpp"
    (tree / "ggml").mkdir(parents=True)
    (tree / "CMakeLists.txt").write_text("project(llama.cpp)\n")
    with pytest.raises(UsageError, match="is a llama.cpp source tree"):
        _export(RULE, tmp_path, tree)
    assert sorted(p.name for p in tree.iterdir()) == ["CMakeLists.txt", "ggml"]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me\n")
    with pytest.raises(UsageError, match=r"holds files an export does not write \(notes.txt\)"):
        _export(RULE, tmp_path, mine)
    assert (mine / "notes.txt").read_text() == "keep me\n"
    a_file = tmp_path / "file"
    a_file.write_text("mine\n")
    with pytest.raises(UsageError, match="is a file, not a folder"):
        _export(RULE, tmp_path, a_file)
    assert a_file.read_text() == "mine\n"


def test_validate_flags_a_tree_preset_file_and_local_paths(tmp_path: Path) -> None:
    from tuner.result.validate import validate_result

    out = _export(UPSTREAM, tmp_path)
    (out / PRESETS_FILE).rename(out / "CMakePresets.json")  # what exports wrote before: it replaces the tree's file
    report = out / "report.md"
    report.write_text(report.read_text() + "\nmodel: /home/someone/models/l1b.gguf\n")
    bad = {f.check: f.detail for f in validate_result(out).findings if not f.ok}
    assert "would replace llama.cpp's own preset file" in bad["presets"]
    assert bad["no local paths"] == "report.md: /home/someone/models/l1b.gguf"


_STAGING_CHILD = """
import sys, time
from pathlib import Path
from tuner.result.export import staged_export
with staged_export(Path(sys.argv[1])) as tmp:
    (tmp / "config.toml").write_text("half an export")
    print("ready", flush=True)
    time.sleep(60)
"""


def _exporting(out: Path) -> subprocess.Popen[str]:
    """A process inside :func:`staged_export` of ``out``, its staging folder half written."""
    proc = subprocess.Popen([sys.executable, "-c", _STAGING_CHILD, str(out)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_a_killed_exports_leftovers_are_removed_by_the_next_export(tmp_path: Path) -> None:
    from tuner.result.export import staged_export

    out = tmp_path / "results" / "out"
    proc = _exporting(out)
    proc.kill()  # kill -9: no cleanup runs
    proc.communicate()
    (left,) = out.parent.iterdir()
    assert left.name.startswith(".out.tmp-") and (left / "config.toml").is_file()
    # names that are not an export's staging of this -o stay: another -o's, and one mkdtemp would not make
    others = [out.parent / ".other.tmp-abcdefgh", out.parent / ".out.tmp-mine"]
    for p in others:
        p.mkdir()
    live = _exporting(out)  # a live export's staging folder is not removed under it
    try:
        with staged_export(out) as tmp:
            (tmp / "report.md").write_text("whole")
        names = {p.name for p in out.parent.iterdir()} - {p.name for p in others}
        (live_tmp,) = names - {"out"}
        assert left.name != live_tmp and live_tmp.startswith(".out.tmp-") and "out" in names
    finally:
        live.kill()
        live.communicate()
    with staged_export(out) as tmp:
        (tmp / "report.md").write_text("again")
    assert {p.name for p in out.parent.iterdir()} == {"out", *(p.name for p in others)}
    assert (out / "report.md").read_text() == "again"


def test_a_previous_export_moved_aside_by_a_killed_export_is_put_back(tmp_path: Path) -> None:
    # Killed between the two renames: -o is missing, the last whole export is in .out.old-*/x.
    from tuner.result.export import clean_leftovers

    out = tmp_path / "out"
    (tmp_path / ".out.old-abcd1234" / "x").mkdir(parents=True)
    (tmp_path / ".out.old-abcd1234" / "x" / "report.md").write_text("previous")
    (tmp_path / ".out.tmp-efgh5678").mkdir()
    clean_leftovers(out)
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and (out / "report.md").read_text() == "previous"
