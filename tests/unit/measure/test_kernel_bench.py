from __future__ import annotations

import re
import stat
from pathlib import Path

import pytest

from tuner.errors import UsageError
from tuner.measure.kernel_bench import (
    FaShape,
    fa_test_file,
    force_kernel_env,
    ggml_enums,
    parse_perf_output,
    run_round,
    shape_for_model,
)
from tuner.plan.fa_rules import parse_fa_rules
from tuner.targets.models import load_models

DATA = Path(__file__).resolve().parents[2] / "data" / "kbench"
ENUMS = DATA / "ggml-enums.h"
# The shapes of the recorded CPU run (tests/data/kbench/perf-cpu.log, made by run_round on the pinned tree's
# CPU build): the `tiny` model's decode at n_kv 256 with f16 and q8_0 K/V, and an 8-token prefill.
TINY = load_models()["tiny"]
SHAPES = [
    shape_for_model(TINY, n_kv=256),
    shape_for_model(TINY, n_kv=256, kv_type="q8_0"),
    shape_for_model(TINY, n_kv=256, n_batch=8),
]


def test_test_file_is_the_recorded_one() -> None:
    assert fa_test_file(SHAPES, ENUMS) == (DATA / "fa-shapes.txt").read_text()


def test_enums_from_the_pinned_header(tmp_path: Path) -> None:
    """The op number of the recorded file is the one test-backend-ops ran as FLASH_ATTN_EXT (perf-cpu.log)."""
    op, types = ggml_enums(ENUMS)
    recorded = (DATA / "fa-shapes.txt").read_text().splitlines()
    assert {int(line.split()[0]) for line in recorded} == {op}
    assert (DATA / "perf-cpu.log").read_text().count("FLASH_ATTN_EXT(") == len(recorded)
    assert {"f32", "f16", "q8_0", "q4_0", "bf16", "iq4_nl"} <= set(types)
    (tmp_path / "ggml.h").write_text("enum ggml_type { GGML_TYPE_F32 = 0 };\n")
    with pytest.raises(UsageError, match="enum ggml_op"):
        ggml_enums(tmp_path / "ggml.h")


def _sources(vars_text: str) -> list[tuple[str, list[int], list[int] | None]]:
    src = vars_text.split("sources=", 1)[1]
    return [
        (t, [int(x) for x in ne.split(",")], [int(x) for x in nb.split(",")] if nb else None)
        for t, ne, nb in re.findall(r"(\w+)\[([\d,]+)\](?:nb\[([\d,]+)\])?", src)
    ]


def test_test_backend_ops_read_back_the_shapes_written() -> None:
    """What test-backend-ops echoed for each case (its vars) is what the file says: types, shapes, strides."""
    log = (DATA / "perf-cpu.log").read_text()
    _op, types = ggml_enums(ENUMS)
    names = {v: k for k, v in types.items()}
    echoed = re.findall(r"FLASH_ATTN_EXT\((name=kb\d+[^\n]*)\):", re.sub(r"\x1b\[[0-9;]*m", "", log))
    lines = fa_test_file(SHAPES, ENUMS).splitlines()
    assert len(echoed) == len(lines) == len(SHAPES)
    for line, vars_text, shape in zip(lines, echoed, SHAPES):
        f = [int(x) for x in line.split()[:-1]]
        n_par = f[6]
        rest = f[7 + n_par + 1 :]
        written = [(names[rest[i]], rest[i + 1 : i + 5], rest[i + 5 : i + 9]) for i in range(0, 36, 9)]
        got = _sources(vars_text)
        assert [(t, ne) for t, ne, _ in got] == [(t, ne) for t, ne, _ in written]
        for (_t, _ne, nb_got), (_t2, _ne2, nb_w) in zip(got, written):
            assert nb_got is None or nb_got == nb_w  # contiguous sources are echoed without strides
        assert f"name=kb{SHAPES.index(shape)}_{shape.key.replace('/', '_')}" in vars_text
        assert written[1][0] == shape.kv_type and written[1][1][1] == shape.n_kv and written[0][1][1] == shape.n_batch


def test_parse_recorded_cpu_output() -> None:
    got = parse_perf_output((DATA / "perf-cpu.log").read_text())
    assert sorted(got) == list(range(len(SHAPES)))
    for runs, us, why in got.values():
        assert runs > 0 and us is not None and us > 0 and why == ""
    # the prefill case reads 8 queries per run: slower than the same shape's decode
    assert got[2][1] > got[0][1]


def test_parse_not_supported_and_noise() -> None:
    text = (
        "  FLASH_ATTN_EXT(name=kb3_D576_gqa16_kvq4_1_nkv256_nb1,type=f32,ne=[512,16,1,1]): not supported\n"
        "  FLASH_ATTN_EXT(type=f32,ne=[64,4,1,1]): 10 runs - 1.00 us/run\n"  # not one of ours (no kb name)
        "tuner-fa: D=64 DV=64 ne1=1 gqa=4 n_kv=256 kernel=VEC (rule)\n"
    )
    assert parse_perf_output(text) == {3: (0, None, "not supported")}


def test_shape_checks() -> None:
    with pytest.raises(UsageError, match="multiple of n_head_kv"):
        FaShape(head_dim=64, head_dim_v=64, n_head=6, n_head_kv=4, n_kv=256)
    with pytest.raises(UsageError, match="kv_type"):
        FaShape(head_dim=64, head_dim_v=64, n_head=4, n_head_kv=1, n_kv=256, kv_type="q2_k")
    with pytest.raises(UsageError, match="n_kv"):
        FaShape(head_dim=64, head_dim_v=64, n_head=4, n_head_kv=1, n_kv=0)
    s = SHAPES[0]
    assert (s.gqa, s.phase, SHAPES[2].phase) == (TINY.n_heads // TINY.n_kv_heads, "decode", "prefill")


@pytest.mark.parametrize("kernel", ["VEC", "TILE", "MMA"])
def test_force_env_is_a_valid_rule_set(kernel: str) -> None:
    rules = parse_fa_rules(force_kernel_env(kernel)["GGML_TUNER_FA_RULES"])
    assert {r.kernel for r in rules} == {kernel} and {r.phase.value for r in rules} == {"decode", "prefill"}


def _fake_tbo(tmp_path: Path, body: str) -> Path:
    """A build layout (build/bin + src/ggml/include/ggml.h) whose test-backend-ops is a script."""
    root = tmp_path / "b"
    bin_dir = root / "build" / "bin"
    bin_dir.mkdir(parents=True)
    inc = root / "src" / "ggml" / "include"
    inc.mkdir(parents=True)
    (inc / "ggml.h").write_text(ENUMS.read_text())
    exe = bin_dir / "test-backend-ops"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def test_run_round_maps_cases_kernels_and_failures(tmp_path: Path) -> None:
    rec = DATA / "perf-cpu.log"
    fa = "tuner-fa: D=64 DV=64 ne1=1 gqa=4 n_kv=256 kernel=$K (rule)"
    body = f'[ "$K" = crash ] && exit 3\necho "{fa}"\ncat "{rec}"\n'
    bin_dir = _fake_tbo(tmp_path, body)
    out = run_round(
        bin_dir, SHAPES, {"vec": {"K": "VEC"}, "bad": {"K": "crash"}}, log_dir=tmp_path / "logs", timeout=30
    )
    assert [(k.label, k.shape) for k in out] == [(lbl, s) for lbl in ("vec", "bad") for s in SHAPES]
    want = parse_perf_output(rec.read_text())
    vec, bad = out[: len(SHAPES)], out[len(SHAPES) :]
    assert [k.us_per_run for k in vec] == [want[i][1] for i in range(len(SHAPES))]
    assert [k.kernel for k in vec] == ["VEC", "VEC", None]  # the FA log line names D, ne1, gqa, n_kv of decode
    assert all(k.error == "" and k.backend == "CPU" for k in vec)
    assert all(k.us_per_run is None and "code 3" in k.error for k in bad)
    cmd = (tmp_path / "logs" / "kbench-vec.log").read_text().splitlines()[0]
    assert cmd.endswith(f"perf -b CPU -o FLASH_ATTN_EXT --test-file {tmp_path / 'logs' / 'fa-shapes.txt'}")


def test_run_round_rejects_bad_input(tmp_path: Path) -> None:
    bin_dir = _fake_tbo(tmp_path, "exit 0\n")
    with pytest.raises(UsageError, match="No candidates"):
        run_round(bin_dir, SHAPES, {}, log_dir=tmp_path)
    with pytest.raises(UsageError, match="backend name"):
        run_round(bin_dir, SHAPES, {"a": {}}, log_dir=tmp_path, backend="CUDA0; rm")
    with pytest.raises(UsageError, match="label"):
        run_round(bin_dir, SHAPES, {"a b": {}}, log_dir=tmp_path)
    with pytest.raises(UsageError, match="not found"):
        run_round(tmp_path, SHAPES, {"a": {}}, log_dir=tmp_path)
