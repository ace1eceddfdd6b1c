"""``tuner validate`` treats a result folder as data: hostile copies of the stored results (built here in
tmp_path) never run their code, write outside a scratch folder, fetch, follow links or crash the run."""

from __future__ import annotations

import hashlib
import lzma
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from tuner.cli import cli
from tuner.result import checks

RESULTS = Path(__file__).resolve().parents[3] / "results"
TABLE = RESULTS / "sm_90" / "fattn-mmq-table"
RESULT = RESULTS / "sm_90" / "llama-3.2-1b-q4_k_m"


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _invoke(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli, ["validate", *args])
    assert not isinstance(res.exception, Exception) or isinstance(res.exception, SystemExit), res.output
    return res.exit_code, res.output


def _rehash(folder: Path, manifest: str, patch: str) -> None:
    """Record the edited patch's sha256 in the manifest, as a hostile contributor would."""
    m = folder / manifest
    sha = hashlib.sha256((folder / patch).read_bytes()).hexdigest()
    m.write_text(re.sub(r'patch_sha256 = "[0-9a-f]*"', f'patch_sha256 = "{sha}"', m.read_text(), count=1))


def _add_lines(patch: str, after: str, lines: list[str]) -> str:
    """``lines`` added after the patch line ``after``, with the hunk headers of that file kept valid."""
    out, seen, shift = [], False, 0
    for ln in patch.splitlines(keepends=True):
        if ln.startswith("diff --git"):
            shift = 0
        m = re.match(r"@@ -(\d+),(\d+) \+(\d+),(\d+) @@(.*)", ln, re.S)
        if m and shift:
            ln = f"@@ -{m[1]},{m[2]} +{int(m[3]) + shift},{m[4]} @@{m[5]}"
        out.append(ln)
        if ln.rstrip("\n") == after and not seen:
            seen, shift = True, len(lines)
            out += [x + "\n" for x in lines]
            hunk = max(i for i, x in enumerate(out) if x.startswith("@@"))
            h = re.match(r"@@ -(\d+),(\d+) \+(\d+),(\d+) @@(.*)", out[hunk], re.S)
            assert h is not None
            out[hunk] = f"@@ -{h[1]},{h[2]} +{h[3]},{int(h[4]) + len(lines)} @@{h[5]}"
    assert seen, after
    return "".join(out)


@pytest.mark.integration
def test_table_lookup_never_compiles_the_folders_code(tree_a, tmp_path: Path) -> None:
    """Code added to upstream.patch (its hash re-recorded) is not compiled or run by the lookup check."""
    folder = _copy(TABLE, tmp_path / "table")
    pwned = tmp_path / "pwned"
    patch = folder / "upstream.patch"
    patch.write_text(
        _add_lines(
            patch.read_text(),
            "+};",
            ['+extern "C" int system(const char*);', f'+static const int pwn = system("touch {pwned}");'],
        )
    )
    _rehash(folder, "table.toml", "upstream.patch")
    code, out = _invoke(str(folder))
    assert code == 1, out
    assert "✕ re-render" in out and "✕ patch hash" not in out
    assert not pwned.exists(), "the lookup compiled and ran code from the folder's upstream.patch"


@pytest.mark.integration
@pytest.mark.parametrize("where", ["../source.json", "../../{sid}/source.json", "{abs}"])
def test_patch_paths_outside_the_tree_are_findings(
    tree_a, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A patch naming ``..`` or an absolute path is a finding; nothing is copied outside the scratch folder."""
    import tempfile

    scratch = tmp_path / "outer" / "scratch"
    scratch.mkdir(parents=True)
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", None)
    victim = tmp_path / "outer" / tree_a.source_id / "source.json"  # where <scratch>/<tmp>/../../<sid>/ lands
    victim.parent.mkdir()
    victim.write_text("sentinel\n")
    absolute = tmp_path / "victim.txt"
    absolute.write_text("sentinel\n")
    rel = where.format(sid=tree_a.source_id, abs=absolute)
    folder = _copy(RESULT, tmp_path / "result")
    up = folder / "upstream.patch"
    up.write_text(up.read_text().replace("--- a/ggml/src/ggml-cuda/fattn.cu", f"--- a/{rel}", 1))
    code, out = _invoke(str(folder))
    assert code == 1, out
    assert re.search(r"✕ upstream.patch applies: .*not plain relative paths inside the tree", out), out
    assert victim.read_text() == "sentinel\n" and absolute.read_text() == "sentinel\n"
    assert list(scratch.iterdir()) == []


@pytest.mark.parametrize(
    ("line", "bad"),
    [
        ("--- a/../x", "a/../x"),
        ("+++ b/ok/../../x", "b/ok/../../x"),
        ("--- a//etc/passwd", "a//etc/passwd"),
        ("--- /etc/passwd", "/etc/passwd"),
        ("diff --git a/ok b/../x", "b/../x"),
        ('diff --git "a/ok" "b/\\056\\056/x"', "b/../x"),
        ("rename from ../x", "../x"),
        ("copy to /abs", "/abs"),
        ("rename to ok\\..\\x", "ok\\..\\x"),
    ],
)
def test_every_path_header_is_checked(line: str, bad: str) -> None:
    assert checks.unsafe_patch_paths(f"{line}\n") == [bad]


def test_plain_paths_pass() -> None:
    text = "diff --git a/g/f.cu b/g/f.cu\n--- a/g/f.cu\n+++ b/g/f.cu\n--- /dev/null\nrename from g/x\nrename to g/y\n"
    assert checks.unsafe_patch_paths(text) == []


def _git_spec_folders(tmp_path: Path) -> list[Path]:
    spec = "git:https://example.invalid/llama.cpp.git@v1"
    res = _copy(RESULT, tmp_path / "result")
    (res / "config.toml").write_text(
        re.sub(r'spec = "[^"]*"', f'spec = "{spec}"', (res / "config.toml").read_text(), count=1)
    )
    tab = _copy(TABLE, tmp_path / "table")
    (tab / "table.toml").write_text(
        re.sub(r'spec = "[^"]*"', f'spec = "{spec}"', (tab / "table.toml").read_text(), count=1)
    )
    return [res, tab]


def test_validate_fetches_nothing(isolated_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A git: SPEC the cache lacks is a finding; only --fetch clones it."""
    import tuner.source.fetch as fetch
    from tuner.errors import TunerError

    calls: list[str] = []

    def fake(parsed: object) -> None:
        calls.append(str(parsed))
        raise TunerError("no network in this test")

    monkeypatch.setattr(fetch, "_fetch_git", fake)
    monkeypatch.setattr(fetch, "_fetch_pypi", fake)
    folders = _git_spec_folders(tmp_path)
    code, out = _invoke(*map(str, folders))
    assert code == 1 and calls == [], out
    assert out.count("is not in the source cache") == 2, out
    code, out = _invoke("--fetch", *map(str, folders))
    assert code == 1 and len(calls) == 2, out


def _run_validate(*paths: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``tuner validate`` in a child with a deadline and a memory limit (a hang or a read without bound fails)."""

    def limits() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))

    return subprocess.run(
        [sys.executable, "-m", "tuner", "validate", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=limits,
        env={**os.environ, **(env or {})},
        check=False,
    )


@pytest.mark.parametrize("kind", ["link to /etc/passwd", "FIFO config.toml", "config.toml -> /dev/zero"])
def test_links_and_special_files_are_not_read(tuner_home: Path, tmp_path: Path, kind: str) -> None:
    folder = _copy(RESULT, tmp_path / "result")
    if kind == "link to /etc/passwd":
        (folder / "notes.md").symlink_to("/etc/passwd")
    elif kind == "FIFO config.toml":
        (folder / "config.toml").unlink()
        os.mkfifo(folder / "config.toml")
    else:
        (folder / "config.toml").unlink()
        (folder / "config.toml").symlink_to("/dev/zero")
    try:
        res = _run_validate(folder)
    except subprocess.TimeoutExpired:
        pytest.fail(f"tuner validate hung on a {kind}")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "✕ folder contents" in res.stdout and str(folder) in res.stdout, res.stdout
    assert "/bin/" not in res.stdout  # no line of /etc/passwd


@pytest.mark.integration
def test_evidence_is_decompressed_with_a_cap(tree_a, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An evidence file that decompresses past the cap is a finding (its hash re-recorded so it matches)."""
    from tuner.sweep import export

    monkeypatch.setattr(export, "MAX_EVIDENCE_BYTES", 2**20)
    folder = _copy(TABLE, tmp_path / "table")
    xz = folder / "evidence" / "sweep.sqlite3.xz"
    xz.write_bytes(lzma.compress(b"\0" * (4 * export.MAX_EVIDENCE_BYTES)))
    m = folder / "table.toml"
    old = hashlib.sha256((TABLE / "evidence" / "sweep.sqlite3.xz").read_bytes()).hexdigest()
    m.write_text(m.read_text().replace(old, hashlib.sha256(xz.read_bytes()).hexdigest()))
    code, out = _invoke(str(folder))
    assert code == 1, out
    assert re.search(r"✕ recomposed from evidence: .*sweep.sqlite3.xz decompresses to more than 1 MiB", out), out


def _edit_config(folder: Path, how: str) -> None:
    cfg = folder / "config.toml"
    if how == "not UTF-8":
        cfg.write_bytes(cfg.read_bytes() + b'\nnote = "\xff\xfe"\n')
    elif how == "nested":
        cfg.write_text(cfg.read_text() + "deep = " + "[" * 100_000 + "]" * 100_000 + "\n")
    elif how == "source = 5":
        text = cfg.read_text()
        block = re.search(r"^\[source\]\n(?:[^\[].*\n)*", text, re.M)
        assert block is not None
        cfg.write_text("source = 5\n" + text.replace(block.group(0), ""))
    else:
        cfg.write_text(re.sub(r'arch = "sm_90"', 'arch = "sm_bogus"', cfg.read_text(), count=1))


@pytest.mark.integration
@pytest.mark.parametrize("how", ["not UTF-8", "nested", "source = 5", "bad arch"])
def test_a_bad_folder_is_named_and_the_others_still_checked(tree_a, tmp_path: Path, how: str) -> None:
    bad = _copy(RESULT, tmp_path / "a-bad")
    good = _copy(RESULT, tmp_path / "b-good")
    _edit_config(bad, how)
    code, out = _invoke(str(tmp_path))
    assert code == 1, out
    assert f"FAIL {bad}" in out and f"ok  {good}" in out, out
    assert "1 passed, 1 failed" in out


@pytest.mark.integration
def test_a_killed_exports_leftover_fails(tree_a, tmp_path: Path) -> None:
    parent = tmp_path / "sm_90"
    _copy(RESULT, parent / RESULT.name)
    left = _copy(RESULT, parent / f".{RESULT.name}.tmp-k9x2ab")
    (left / "report.md").unlink()  # the export was killed before it wrote report.md
    norep = _copy(RESULT, parent / "no-report")
    (norep / "report.md").unlink()
    code, out = _invoke(str(parent))
    assert code == 1, out
    assert f"FAIL {left}" in out and "leftover of an interrupted export" in out, out
    assert f"FAIL {norep}" in out and "report.md is missing" in out, out
    assert f"ok  {parent / RESULT.name}" in out


def _stored() -> list[Path]:
    return sorted({p.parent for p in RESULTS.rglob("config.toml")} | {p.parent for p in RESULTS.glob("*/*/table.toml")})


def _hostile(folder: Path, sentinel_rel: str) -> None:
    """A ``../`` path in every patch of ``folder`` (an upstream.patch added where it has none)."""
    patches = [p for p in (folder / "tuned.patch", folder / "upstream.patch") if p.is_file()]
    if not patches:
        patches = [folder / "upstream.patch"]
        patches[0].write_text((RESULT / "upstream.patch").read_text())
    for p in patches:
        text = p.read_text()
        first = re.search(r"^--- a/(\S+)$", text, re.M)
        assert first is not None
        p.write_text(text.replace(f"--- a/{first[1]}", f"--- a/{sentinel_rel}", 1))


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            st = p.lstat()
            out[str(p)] = (st.st_mtime_ns, st.st_size)
    return out


@pytest.fixture()
def writable_again(tmp_path: Path) -> Iterator[None]:
    yield
    for dirpath, dirnames, _ in os.walk(tmp_path):
        for n in [".", *dirnames]:
            p = Path(dirpath) / n
            p.chmod(p.stat().st_mode | stat.S_IWUSR)


@pytest.mark.integration
def test_hostile_copies_of_every_stored_result_write_nothing_outside(
    tree_a, tuner_home: Path, tmp_path: Path, writable_again: None
) -> None:
    """Each stored result, copied with a ``../`` patch path, validated from a read-only tree: the sentinel the
    path names, the rest of tmp_path and the source cache stay as they were, and $TMPDIR holds nothing after."""
    scratch = tmp_path / "outer" / "scratch"
    scratch.mkdir(parents=True)
    sentinel = tmp_path / "outer" / tree_a.source_id / "source.json"
    sentinel.parent.mkdir()
    sentinel.write_text("sentinel\n")
    tree = tmp_path / "tree"
    for f in _stored():
        _hostile(_copy(f, tree / f.relative_to(RESULTS)), f"../../{tree_a.source_id}/source.json")
    for dirpath, dirnames, filenames in os.walk(tree):
        for n in filenames + dirnames:
            (Path(dirpath) / n).chmod(stat.S_IREAD | (stat.S_IEXEC if n in dirnames else 0))
    tree.chmod(stat.S_IREAD | stat.S_IEXEC)
    before, cache = _snapshot(tmp_path), _snapshot(tuner_home / "sources")
    res = _run_validate(tree, env={"TMPDIR": str(scratch), "TUNER_HOME": str(tuner_home)})
    assert res.returncode == 1, res.stdout + res.stderr
    assert res.stdout.count("not plain relative paths inside the tree") >= len(_stored()), res.stdout
    assert sentinel.read_text() == "sentinel\n"
    assert list(scratch.iterdir()) == []
    after = _snapshot(tmp_path)
    for snap in (before, after):  # the scratch folder itself may change (temporary folders made and removed there)
        snap.pop(str(scratch))
    assert after == before
    assert _snapshot(tuner_home / "sources") == cache


@pytest.mark.integration
def test_gpu_builds_only_tuners_render_of_upstream_patch(
    tree_a, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--gpu`` builds a result's upstream.patch only where it is tuner's re-render of config.toml."""
    from tuner.result import upstream_check
    from tuner.result.validate import validate_result

    built: list[Path] = []

    def fake_gpu(folder: Path, *_: object, **__: object) -> list[checks.Finding]:
        built.append(folder)
        return [checks.Finding(check="upstream.patch builds", ok=True, detail="faked")]

    monkeypatch.setattr(upstream_check, "upstream_gpu_findings", fake_gpu)
    good = _copy(RESULT, tmp_path / "good")
    assert validate_result(good, gpu={}).ok and built == [good]
    bad = _copy(RESULT, tmp_path / "bad")
    up = bad / "upstream.patch"
    first_added = next(ln for ln in up.read_text().splitlines() if ln.startswith("+") and not ln.startswith("+++"))
    up.write_text(_add_lines(up.read_text(), first_added, ['+        static const int pwn = system("id");']))
    found = {f.check: f for f in validate_result(bad, gpu={}).findings}
    assert built == [good]
    assert not found["upstream.patch re-render"].ok and found["upstream.patch applies"].ok
    assert "not built" in found["upstream.patch on the GPU"].detail


@pytest.mark.parametrize(
    "toml",
    ['schema = 3\nmodel = "x"\n[target]\narch = "cpu"\n', "schema = 3\n"],
    ids=["model-not-a-table", "no-target"],
)
def test_soak_refuses_a_config_that_fails_its_schema_before_reading_it(tmp_path: Path, toml: str) -> None:
    """`tuner validate --soak` reads each folder's config.toml: one that fails the schema is a UsageError naming
    it (exit 2), not an AttributeError or KeyError from the fields it lacks."""
    from tuner.errors import UsageError
    from tuner.result.validate import soak_results

    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "config.toml").write_text(toml)
    with pytest.raises(UsageError, match=r"r/config\.toml is not a result tuner can soak \(missing key"):
        soak_results([tmp_path / "r"], 100)
