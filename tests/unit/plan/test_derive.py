"""Derived knobs (threads, -ngl): legal values from the machine and the model, pins, scopes, schema."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.errors import UsageError
from tuner.plan import space
from tuner.plan.derive import legal_values, resolve_space, space_for_run
from tuner.targets.host import Cpus

L1B = {"n_layers": 16, "n_kv_heads": 8, "head_dim": 64}
GIB = 1 << 30
SMT16 = Cpus(ids=tuple(range(32)), physical=16, masked=False)
MASK2 = Cpus(ids=(0, 1), physical=2, masked=True)


def _resolved(arch: str, cpus: Cpus, **kw: object) -> space.SearchSpace:
    sp = space.load_space(arch, "mma")
    return resolve_space(sp, legal_values(sp, cpus=cpus, **kw))  # type: ignore[arg-type]


def test_threads_sample_physical_and_logical_and_half() -> None:
    t = _resolved("sm_90", SMT16, shape=L1B).knob("threads")
    assert t.choices == ("default", 8, 16, 32) and (t.low, t.high) == (1, 32)
    assert t.default == "default"  # llama-bench's own count: the untouched space measures upstream
    m = _resolved("sm_90", MASK2, shape=L1B).knob("threads")
    assert m.choices == ("default", 1, 2) and m.high == 2 and "--cpu-mask 0-1" in m.meta["legal"]


def test_a_thread_pin_outside_the_cpus_is_refused_naming_the_range() -> None:
    sp = _resolved("cpu", MASK2)
    assert space.parse_set_values(sp, ["threads=2"])[1] == {"threads": 2}
    for bad in ("0", "-1", "3", "many"):
        with pytest.raises(UsageError) as e:
            space.parse_set_values(sp, [f"threads={bad}"])
        assert e.value.exit_code == 2 and "1..2" in str(e.value) and "\n" not in str(e.value), bad


def test_any_thread_count_in_range_may_be_pinned_though_not_sampled() -> None:
    sp = _resolved("sm_90", SMT16, shape=L1B)
    assert space.parse_set_values(sp, ["threads=5"])[1] == {"threads": 5}
    assert 5 not in sp.knob("threads").choices


def test_ngl_is_full_offload_when_the_model_fits_or_memory_is_unknown() -> None:
    fits = _resolved("sm_90", SMT16, shape=L1B, model_bytes=2 * GIB, gpu_free_bytes=80 * GIB, tokens=65536 + 512)
    k = fits.knob("ngl")
    assert k.choices == ("default",) and (k.low, k.high) == (0, 17) and "it fits" in k.meta["legal"]
    unknown = _resolved("sm_90", SMT16, shape=L1B, model_bytes=2 * GIB, gpu_free_bytes=None)
    assert unknown.knob("ngl").choices == ("default",) and "unknown" in unknown.knob("ngl").meta["legal"]


def test_ngl_samples_partial_offload_when_the_model_does_not_fit() -> None:
    # 16 GiB of weights + 2 GiB of f16 KV at 65536 tokens (2*2*16*8*64*65536 B) against 10 GiB free
    sp = _resolved("sm_90", SMT16, shape=L1B, model_bytes=16 * GIB, gpu_free_bytes=10 * GIB, tokens=65536)
    k = sp.knob("ngl")
    fit = int(10 * GIB * 0.9) * 17 // (18 * GIB)  # the layers whose share of weights and KV fits
    assert k.choices == ("default", fit // 2, fit * 3 // 4, fit) and 0 < fit < 16
    assert "does not fit" in k.meta["legal"]


def test_an_ngl_pin_above_the_layer_count_is_refused() -> None:
    sp = _resolved("sm_90", SMT16, shape=L1B)
    assert space.parse_set_values(sp, ["ngl=17"])[1] == {"ngl": 17}  # all 16 layers + the output layer
    assert space.parse_set_values(sp, ["ngl=0"])[1] == {"ngl": 0}
    with pytest.raises(UsageError) as e:
        space.parse_set_values(sp, ["ngl=99"])
    assert "0..17" in str(e.value) and "16 layers" in str(e.value)
    with pytest.raises(UsageError):
        space.parse_set_values(sp, ["ngl=-1"])


def test_defaults_pass_no_flag_and_values_pass_theirs() -> None:
    sp = _resolved("sm_90", MASK2, shape=L1B)
    _, args = space.runtime_env_and_args(sp, sp.defaults("runtime"))
    assert "-t" not in args and "-ngl" not in args  # llama-bench's own defaults
    assert args[args.index("-b") + 1] == "2048" and args[args.index("-nkvo") + 1] == "0"
    _, args = space.runtime_env_and_args(sp, {"threads": 1, "ngl": 9, "no_kv_offload": 1})
    assert args == ["-t", "1", "-ngl", "9", "-nkvo", "1"]


@pytest.mark.parametrize("arch", ["sm_90", "sm_89", "gfx1151", "gfx1100", "gfx1201", "gfx942"])
def test_gpu_spaces_declare_each_config_knob_and_its_phases(arch: str) -> None:
    for era in ("mma", "rocwmma"):
        sp = space.load_space(arch, era)
        flags = {k.meta["flag"]: k for k in sp.runtime_knobs if k.kind == "bench_flag"}
        assert {"-ub", "-b", "-t", "-ngl", "-nkvo"} <= set(flags), (arch, era)
        assert flags["-ub"].meta["phases"] == ("pp",) and flags["-b"].meta["phases"] == ("pp",)
        for both in ("-t", "-ngl", "-nkvo"):  # no phases key: the tune stage measures both
            assert "phases" not in flags[both].meta
        assert flags["-t"].meta["derive"] == "threads" and flags["-ngl"].meta["derive"] == "ngl"


def test_the_stored_form_resolves_the_same_space() -> None:
    import dataclasses

    sp = space.load_space("sm_90", "mma")
    legal = legal_values(sp, cpus=MASK2, shape=L1B)
    stored = {k: dataclasses.asdict(v) for k, v in legal.items()}  # what the study keeps for the export
    assert resolve_space(sp, stored).knob("threads") == resolve_space(sp, legal).knob("threads")


def test_space_for_run_reads_the_model(tmp_path: Path) -> None:
    from tuner.targets.models import load_models, synth_model

    data = Path(__file__).resolve().parents[2] / "data" / "models"
    shape = load_models(data / "micro_models.toml")["micro"]
    model = synth_model(shape, tmp_path / "m.gguf", vocab_path=data / "vocab-micro.gguf").path
    sp, legal = space_for_run(space.load_space("sm_90", "mma"), cpu_mask=None, model=model, gpu=False)
    assert sp.knob("ngl").high == 3 and "2 layers" in legal["ngl"].why  # micro: 2 layers + output


def _write(tmp_path: Path, knob: str) -> Path:
    p = tmp_path / "x.toml"
    p.write_text('arch = "x"\n[era.mma]\nvariants = ["cuda"]\n[[era.mma.runtime]]\n' + knob)
    return p


@pytest.mark.parametrize(
    ("knob", "says"),
    [
        (
            'name = "t"\nkind = "bench_flag"\nflag = "-t"\nderive = "threads"\nchoices = [1, 2]\ndefault = "default"\n',
            "no choices",
        ),
        ('name = "t"\nkind = "bench_flag"\nflag = "-t"\nderive = "threads"\ndefault = 4\n', "default = 'default'"),
        ('name = "t"\nkind = "bench_flag"\nflag = "-ngl"\nderive = "threads"\ndefault = "default"\n', "derives -t"),
        ('name = "t"\nkind = "bench_flag"\nflag = "-t"\nderive = "cores"\ndefault = "default"\n', "derive 'cores'"),
    ],
)
def test_schema_rejects_a_bad_derived_knob(tmp_path: Path, knob: str, says: str) -> None:
    with pytest.raises(UsageError) as e:
        space.load_space("x", "mma", path=_write(tmp_path, knob))
    assert says in str(e.value)
