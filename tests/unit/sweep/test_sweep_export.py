"""``tuner sweep export`` and ``tuner validate`` of a sweep table (tuner/sweep/export.py, table_check.py) on a
fabricated sweep (fake timings), a confirmation on fake llama-bench timings and a fake gate, and a small
fabricated llama.cpp tree: the export validates; an edited patch, an edited manifest rule and missing evidence
fail with a clear message; an A/A-only grid exports an empty table without a patch."""

from __future__ import annotations

import lzma
import shutil
import types
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.unit.sweep.test_sweep_confirm import SHAPE, SM90, FakeBench, _sweep_dir, passing_check
from tuner._compat import tomllib
from tuner.cli.export_cmd import validate
from tuner.cli.sweep_cmd import sweep
from tuner.errors import UsageError
from tuner.rounds.store import Sample, SampleStore
from tuner.sweep import confirm, live, mmq
from tuner.sweep.confirm_report import e2e_text, pr_text
from tuner.sweep.grid import AA, DEFAULT, plan
from tuner.sweep.table_check import validate_table

FATTN = """#include "common.cuh"

enum best_fattn_kernel {
    BEST_FATTN_KERNEL_NONE     =   0,
    BEST_FATTN_KERNEL_TILE     = 200,
    BEST_FATTN_KERNEL_VEC      = 100,
    BEST_FATTN_KERNEL_WMMA_F16 = 300,
    BEST_FATTN_KERNEL_MMA_F16  = 400,
};

static best_fattn_kernel ggml_cuda_get_best_fattn_kernel(const int device, const ggml_tensor * dst) {
    const int cc = ggml_cuda_info().devices[device].cc;
    const int gqa_ratio = Q->ne[2] / K->ne[2];
    bool gqa_opt_applies = gqa_ratio % 2 == 0 && mask;
    const bool can_use_vector_kernel = Q->ne[0] <= 256 && Q->ne[0] % 64 == 0 && K->ne[1] % FATTN_KQ_STRIDE == 0;

    if (turing_mma_available(cc) && Q->ne[0] != 40 && Q->ne[0] != 72) {
        return BEST_FATTN_KERNEL_MMA_F16;
    }
    return BEST_FATTN_KERNEL_TILE;
}
"""
COMMON = "#define GGML_CUDA_CC_TURING 750\n#define GGML_CUDA_CC_HOPPER 900\n"


def _fake_source(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``fetch_source`` (and validate's ``cached_source``) returns a tree with just the fattn.cu structure the table's patch is written for."""
    import tuner.source

    root = tmp / "tree"
    (root / "ggml/src/ggml-cuda").mkdir(parents=True)
    (root / "ggml/src/ggml-cuda/fattn.cu").write_text(FATTN)
    (root / "ggml/src/ggml-cuda/common.cuh").write_text(COMMON)
    ns = types.SimpleNamespace(root=root, era="mma", spec="fake:tree", source_id="f" * 16, commit="0c1e570")
    monkeypatch.setattr(tuner.source, "fetch_source", lambda spec=None: ns)
    monkeypatch.setattr(tuner.source, "cached_source", lambda spec: ns)  # what validate looks up: cached
    return root


def _mmq_dir(tmp: Path) -> Path:
    """A CPU MMQ sweep (no MMQ-vs-cuBLAS choice there, so nothing composes), cuBLAS 2x faster at batch 512."""
    out = tmp / "mmq"
    store = SampleStore(
        mmq.MMQ_TABLE, out / "mmq.sqlite3", {"arch": "sm_90", "backend": "CPU", "build": "/b", "timer": "mm-bench"}
    )
    rows = [
        Sample(key=(t, 256, 256, n), config=cfg, round=r, us=us)
        for t in ("q4_0", "q8_0")
        for n in (16, 512)
        for r in range(3)
        for cfg, us in ((DEFAULT, 100.0 + r), (AA, 100.5 + r), ("BLAS", 50.0 if n == 512 else 150.0))
    ]
    store.add(rows)
    store.close()
    return out


def _confirmed(
    tmp: Path,
    *,
    gain: float = 1.10,
    sweep_dir: Path | None = None,
    mmq_dir: Path | None = None,
    bench: FakeBench | None = None,
) -> Path:
    """``tuner sweep confirm``'s output directory (SWEEP_DIR/confirm) on fake timings and a passing gate."""
    sweep_dir = sweep_dir or _sweep_dir(tmp)
    table = confirm.load_table(sweep_dir, mmq_dir)
    out = sweep_dir / "confirm"
    store = confirm.ConfirmStore(out / "confirm.sqlite3", {"build": "/b", "table": confirm.table_id(table)})
    bench = bench or FakeBench(gain=gain)
    try:
        conf = confirm.confirm_models(
            table,
            ["llama-3.2-1b", "qwen2.5-7b"],
            depths=(0, 16384, 32768),
            rounds=4,
            store=store,
            model_for=lambda like: tmp / f"{like}.gguf",
            joint_for=lambda path, plan_: setattr(bench, "batch", plan_.batch) or bench,
            gate=lambda p, path: confirm.gate_model(
                p, path, path, arch=SM90, era="mma", store=store, work_dir=tmp, run_one=passing_check
            ),
            weight_types_of=lambda path: ["Q4_K", "Q6_K", "F32"],
            era="mma",
        )
    finally:
        store.close()
    import tuner.source

    root = tuner.source.fetch_source().root
    patch = confirm.render_kept(root, conf.kept_rules, conf.kept_mmq, table.arch)  # the arch the sweep recorded
    if patch:
        (out / "upstream.patch").write_text(patch)
    (out / "e2e.md").write_text(e2e_text(conf, identity={"build": "b"}, rounds=4))
    (out / "PR.md").write_text(pr_text(table, conf, backend_ops=[], patch=bool(patch)))
    return out


def _export(tmp: Path, confirm_dir: Path, *args: str) -> Path:
    out = tmp / "results" / "sm_90" / "table"
    res = CliRunner().invoke(sweep, ["export", str(confirm_dir), "-o", str(out), *args], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return out


def _failed(folder: Path) -> dict[str, str]:
    return {f.check: f.detail for f in validate_table(folder).findings if not f.ok}


def test_a_kept_small_batch_entry_exports_and_validates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry at Q->ne[1] = 4 kept by its small-batch pass: the patch keys it by that batch, and validate decides
    it again from the evidence (the pass's stored rounds and gate) and checks the lookup at its cells."""
    from tests.unit.sweep.test_sweep_confirm import NE4

    _fake_source(tmp_path, monkeypatch)
    sweep_dir = _sweep_dir(tmp_path, extra=[NE4])
    out = _export(tmp_path, _confirmed(tmp_path, sweep_dir=sweep_dir, bench=FakeBench(gain=1.10, batch_gain=1.10)))
    m = tomllib.loads((out / "table.toml").read_text())
    assert m["table"]["fa_rules"] == [
        "D64 gqa4 f16 ne1 1, n_kv in [16384, inf) -> MMA",
        "D64 gqa4 f16 ne1 4, n_kv in [16384, inf) -> VEC",
    ]
    assert (
        "{  64, 4, GGML_TYPE_F16,  4,  16384,     -1, BEST_FATTN_KERNEL_VEC}," in (out / "upstream.patch").read_text()
    )
    assert _failed(out) == {}


def test_export_then_validate_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_source(tmp_path, monkeypatch)
    out = _export(tmp_path, _confirmed(tmp_path, mmq_dir=_mmq_dir(tmp_path)), "--mmq", str(tmp_path / "mmq"))
    m = tomllib.loads((out / "table.toml").read_text())
    assert m["kind"] == "sweep table" and m["target"]["arch"] == "sm_90"
    assert m["table"]["fa_rules"] == ["D64 gqa4 f16 ne1 1, n_kv in [16384, inf) -> MMA"]
    assert m["table"]["models"] == ["llama-3.2-1b", "qwen2.5-7b"] and m["coverage"]["kept"] == 1
    assert sorted(p.name for p in (out / "evidence").iterdir()) == [
        "confirm.sqlite3.xz",
        "mmq.sqlite3.xz",
        "sweep.sqlite3.xz",
    ]
    assert sorted(m["files"]["plots"]) == ["plots/fa-D64.png", "plots/mmq.png"]
    assert (out / "upstream.patch").read_text().startswith("diff --git a/ggml/src/ggml-cuda/fattn.cu")
    report = (out / "report.md").read_text()
    assert "## FlashAttention kernels" in report and "## MMQ vs cuBLAS" in report and "## End to end" in report
    assert "/b" not in str(m["identity"])  # no local path of the build
    for name in ("report.md", "PR.md", "e2e.md"):  # nor in the reports: a path's last component only
        assert str(tmp_path) not in (out / name).read_text(), name
    check = validate_table(out)
    assert check.ok, [f for f in check.findings if not f.ok]
    names = {f.check for f in check.findings}
    assert {"recomposed from evidence", "re-render", "upstream.patch applies", "patch hash"} <= names
    if shutil.which("g++"):
        lookup = next(f for f in check.findings if f.check == "table lookup")
        assert "agree at 8 calls (4 stored cells)" in lookup.detail
    res = CliRunner().invoke(validate, [str(tmp_path / "results")])
    assert res.exit_code == 0 and "1 passed, 0 failed" in res.output, res.output
    assert "output-equivalence gate" not in res.output  # stored checks re-judged, nothing run: no progress lines
    again = _export(tmp_path, tmp_path / "sweep" / "confirm", "--mmq", str(tmp_path / "mmq"))  # over its own export
    assert (again / "table.toml").read_text() == (out / "table.toml").read_text()


@pytest.mark.skipif(shutil.which("g++") is None, reason="the lookup is compiled with the host's g++")
def test_the_lookup_runs_through_tuner_run_with_its_queries_on_stdin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The compiled lookup took its queries through subprocess.run, outside tuner/_run.py (no process group, no
    # SIGTERM handling), since _run.run had no stdin.
    import subprocess

    from tuner import _run

    _fake_source(tmp_path, monkeypatch)
    out = _export(tmp_path, _confirmed(tmp_path))
    started: list[tuple[str, bool]] = []
    real = _run.run

    def run(cmd: Any, **kw: Any) -> Any:
        started.append((Path(cmd[0]).name, kw.get("input") is not None))
        return real(cmd, **kw)

    def elsewhere(cmd: Any, *a: Any, **kw: Any) -> Any:
        raise AssertionError(f"subprocess.run({cmd!r}) outside tuner/_run.py")

    monkeypatch.setattr(_run, "run", run)
    monkeypatch.setattr(subprocess, "run", elsewhere)
    lookup = next(f for f in validate_table(out).findings if f.check == "table lookup")
    assert lookup.ok and "agree at 8 calls" in lookup.detail, lookup.detail
    assert ("lookup", True) in started  # the program, its queries on stdin


def test_tampering_fails_with_a_clear_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_source(tmp_path, monkeypatch)
    out = _export(tmp_path, _confirmed(tmp_path))
    good = tmp_path / "good"
    shutil.copytree(out, good)

    patch = out / "upstream.patch"
    patch.write_text(patch.read_text().replace("16384,", "8192,"))
    bad = _failed(out)
    assert "edited patch or stale hash" in bad["patch hash"] and "byte for byte" in bad["re-render"]

    shutil.rmtree(out)
    shutil.copytree(good, out)
    text = (out / "table.toml").read_text()
    (out / "table.toml").write_text(text.replace("n_kv in [16384, inf) -> MMA", "n_kv in [8192, inf) -> MMA", 1))
    bad = _failed(out)
    assert "table.fa_rules: table.toml has" in bad["recomposed from evidence"]

    shutil.rmtree(out)
    shutil.copytree(good, out)
    (out / "evidence" / "confirm.sqlite3.xz").unlink()
    bad = _failed(out)
    assert "evidence/confirm.sqlite3.xz" in bad["files"] and "confirm.sqlite3.xz (missing)" in bad["evidence"]
    # evidence that does not hash to its record is never decompressed
    assert "do not hash to what table.toml records" in bad["recomposed from evidence"]

    shutil.rmtree(out)
    shutil.copytree(good, out)
    (out / "evidence" / "sweep.sqlite3.xz").write_bytes(lzma.compress(b"not a database"))
    assert "sha256 differs" in _failed(out)["evidence"]
    res = CliRunner().invoke(validate, [str(out)])
    assert res.exit_code == 1 and "FAIL" in res.output


def test_truncated_confirm_evidence_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sqlite3

    _fake_source(tmp_path, monkeypatch)
    cdir = _confirmed(tmp_path)
    with sqlite3.connect(cdir / "confirm.sqlite3") as db:
        db.execute("DELETE FROM rounds WHERE round = 3")
    with pytest.raises(UsageError, match="lacks a round or a gate check"):
        CliRunner().invoke(
            sweep, ["export", str(cdir), "-o", str(tmp_path / "x")], standalone_mode=False, catch_exceptions=False
        )
    assert not (tmp_path / "x").exists()


def test_an_aa_only_grid_exports_an_empty_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_source(tmp_path, monkeypatch)
    sweep_dir = tmp_path / "sweep"
    store = SampleStore(
        live.TABLE, sweep_dir / "sweep.sqlite3", {"arch": "sm_90", "backend": "CUDA0", "build": "/b", "timer": "t"}
    )
    store.add(
        [
            Sample(key=(c.shape, c.n_kv), config=cfg, round=r, us=100.0 + 0.01 * ((r + i) % 3))
            for c in plan(SM90, n_kv=(4096, 8192))
            if c.shape == SHAPE
            for r in range(3)
            for i, cfg in enumerate(c.configs)
        ]
    )
    store.close()
    out = _export(tmp_path, _confirmed(tmp_path, sweep_dir=sweep_dir))
    m = tomllib.loads((out / "table.toml").read_text())
    assert m["table"]["fa_rules"] == [] and m["table"]["composed_fa_rules"] == [] and m["hashes"]["patch_sha256"] == ""
    assert not (out / "upstream.patch").exists()
    check = validate_table(out)
    assert check.ok, check.findings
    ph = next(f for f in check.findings if f.check == "patch hash")
    assert "empty table: no entry was kept end to end, so there is no upstream.patch" in ph.detail


def test_an_existing_folder_that_is_not_an_export_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_source(tmp_path, monkeypatch)
    cdir = _confirmed(tmp_path)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(UsageError, match="is not an earlier sweep table export") as err:  # exit 2 in `tuner`
        CliRunner().invoke(sweep, ["export", str(cdir), "-o", str(out)], standalone_mode=False, catch_exceptions=False)
    assert err.value.exit_code == 2
    assert (out / "notes.txt").read_text() == "keep me" and len(list(out.iterdir())) == 1


def test_a_stale_confirm_directory_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_source(tmp_path, monkeypatch)
    cdir = _confirmed(tmp_path)
    (cdir / "upstream.patch").unlink()
    with pytest.raises(UsageError, match="upstream.patch is not the patch its confirm.sqlite3 decides"):
        CliRunner().invoke(
            sweep, ["export", str(cdir), "-o", str(tmp_path / "x")], standalone_mode=False, catch_exceptions=False
        )


def test_local_paths_are_cut_to_their_names_and_urls_stay() -> None:
    from tuner.sweep.export import without_local_paths

    text = (
        "- build: /work/main/.devhome/builds/8e0a/bin\nlog `/tmp/x/logs/r0/upstream.log` (see /opt/x/)\n"
        "https://github.com/ggml-org/llama.cpp/issues/18865, ggml/src/ggml-cuda/fattn.cu"
    )
    assert without_local_paths(text) == (
        "- build: bin\nlog `upstream.log` (see x)\n"
        "https://github.com/ggml-org/llama.cpp/issues/18865, ggml/src/ggml-cuda/fattn.cu"
    )


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_sweep_export_is_staged_beside_o_and_clears_a_killed_exports_leftovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It removed -o and then copied the new folder in: a full disk or a kill in between lost both.
    import errno

    import tuner.sweep.export as ex

    _fake_source(tmp_path, monkeypatch)
    cdir = _confirmed(tmp_path)
    out = _export(tmp_path, cdir)
    before = _files(out)
    dead = out.parent / f".{out.name}.tmp-abcd1234"  # what a killed export leaves: no process holds it
    dead.mkdir()
    (dead / "table.toml").write_text("half")
    real = ex._write

    def disk_full(stage: Path, *a: object, **k: object) -> object:
        real(stage, *a, **k)  # type: ignore[arg-type]
        raise OSError(errno.ENOSPC, "No space left on device", str(stage / "table.toml"))

    monkeypatch.setattr(ex, "_write", disk_full)
    with pytest.raises(OSError):
        CliRunner().invoke(sweep, ["export", str(cdir), "-o", str(out)], catch_exceptions=False)
    assert _files(out) == before and list(out.parent.iterdir()) == [out]
    monkeypatch.setattr(ex, "_write", real)
    assert _files(_export(tmp_path, cdir)) == before and list(out.parent.iterdir()) == [out]
