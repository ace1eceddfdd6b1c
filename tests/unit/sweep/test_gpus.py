"""One sweep table confirmed on two GPU models of its arch (tuner/sweep/merge.py), on fake llama-bench timings of
known truth run through the real confirmation: models that agree keep an entry on the compute capability
alone, models that disagree drop it and name what differs, and no store pairs rounds of two models."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.sweep.test_sweep_confirm import DEPTHS, SM90, FakeBench, _sweep_dir, passing_check
from tuner.errors import UsageError
from tuner.sweep import confirm, merge
from tuner.sweep.grid import FaShape

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
RULE = "D64 gqa4 f16 ne1 1, n_kv in [16384, inf) -> MMA"


def _confirm(tmp_path: Path, device: str, gain: float) -> tuple[confirm.Table, Path, confirm.Confirmed]:
    """The planted table confirmed end to end on ``device``, the table's candidate ``gain`` x upstream's t/s
    where its rule acts; the store's identity names the device, as `tuner sweep confirm` records it."""
    table = confirm.load_table(_sweep_dir(tmp_path))
    path = tmp_path / merge.slug(device) / "confirm.sqlite3"
    ident = {"build": "/b", "device": device, "arch": "sm_90", "table": confirm.table_id(table)}
    store = confirm.ConfirmStore(path, ident)
    bench = FakeBench(gain=gain)
    try:
        conf = confirm.confirm_models(
            table,
            ["llama-3.2-1b"],
            depths=DEPTHS,
            rounds=4,
            store=store,
            model_for=lambda like: tmp_path / f"{like}.gguf",
            joint_for=lambda path_, plan_: bench,
            gate=lambda plan_, path_: confirm.gate_model(
                plan_, path_, path_, arch=SM90, era="mma", store=store, work_dir=tmp_path, run_one=passing_check
            ),
            weight_types_of=lambda path_: ["Q4_K", "Q6_K", "F32"],
        )
    finally:
        store.close()
    return table, path, conf


def _joined(tmp_path: Path, gain_h100: float, gain_h200: float) -> merge.Joined:
    _, _, a = _confirm(tmp_path / "a", H100, gain_h100)
    _, _, b = _confirm(tmp_path / "b", H200, gain_h200)
    (j,) = [j for j in merge.join([(H100, a.fates), (H200, b.fates)]) if j.fate.text == RULE]
    return j


def test_two_gpu_models_faster_alike_keep_the_entry_on_the_arch_alone(tmp_path: Path) -> None:
    j = _joined(tmp_path, 1.10, 1.20)
    assert j.action == "patched" and j.kept
    assert [(v.device, v.word) for v in j.verdicts] == [(H100, "faster"), (H200, "faster")]


def test_two_gpu_models_that_disagree_drop_the_entry_and_name_what_differs(tmp_path: Path) -> None:
    j = _joined(tmp_path, 1.10, 0.85)
    assert j.action == "dropped" and not j.kept
    assert [v.word for v in j.verdicts] == ["faster", "slower"] and j.why.startswith("GPU models disagree")
    # their datasheets differ first in memory bandwidth (same SM count and clock): the key a patch would need
    assert merge.differs([H100, H200]) == "memory bandwidth (3.35 TB/s vs 4.8 TB/s)"
    assert merge.differs([H100, "NVIDIA GeForce RTX 9999"]) == ""  # no datasheet: nothing claimed


def test_faster_on_one_gpu_model_and_open_on_the_other_is_patched_with_both_verdicts(tmp_path: Path) -> None:
    j = _joined(tmp_path, 1.00, 1.10)
    assert j.action == "patched" and [v.word for v in j.verdicts] == ["no gain", "faster"]
    assert H100 in j.why and H200 in j.why
    j = _joined(tmp_path / "n", 1.00, 1.00)
    assert j.action == "reported"


def test_a_slower_confirmation_of_one_model_outweighs_its_faster_one(tmp_path: Path) -> None:
    _, _, a = _confirm(tmp_path / "a", H100, 1.10)
    _, _, b1 = _confirm(tmp_path / "b", H200, 1.10)
    _, _, b2 = _confirm(tmp_path / "c", H200, 0.85)
    (j,) = [j for j in merge.join([(H100, a.fates), (H200, b1.fates), (H200, b2.fates)]) if j.fate.text == RULE]
    assert j.action == "dropped" and [v.word for v in j.verdicts] == ["faster", "slower"]


def test_a_confirm_store_refuses_rounds_of_another_gpu_model(tmp_path: Path) -> None:
    table, path, _ = _confirm(tmp_path, H100, 1.10)
    ident = {"build": "/b", "device": H200, "arch": "sm_90", "table": confirm.table_id(table)}
    with pytest.raises(UsageError, match="another identity|device"):
        confirm.ConfirmStore(path, ident)


def test_another_models_store_is_recomposed_against_its_table_and_the_first_models_own_is_refused(
    tmp_path: Path,
) -> None:
    table, path, conf = _confirm(tmp_path, H200, 1.10)
    got = merge.load_confirmation(path, {"part-a": table}, name="confirm", first_device=H100)
    assert got.device == H200 and got.part == "part-a"
    assert [(f.text, f.kept, f.why) for f in got.confirmed.fates] == [(f.text, f.kept, f.why) for f in conf.fates]
    with pytest.raises(UsageError, match="the GPU model the table's own evidence is of"):
        merge.load_confirmation(path, {"part-a": table}, name="confirm", first_device=H200)
    other = confirm.load_table(_sweep_dir(tmp_path, name="other", only=[FaShape(D=128, gqa=4, kv="f16", ne1=1)]))
    with pytest.raises(UsageError, match="which is none of the tables merged"):
        merge.load_confirmation(path, {"part-b": other}, name="confirm", first_device=H100)
