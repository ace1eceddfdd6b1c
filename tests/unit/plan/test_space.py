"""search_spaces/*.toml and tuner.plan.space: schema, errors, distributions, runtime rendering."""

from __future__ import annotations

from pathlib import Path

import optuna.distributions as od
import pytest

from tests.oracles import match_rules
from tuner._compat import tomllib
from tuner.errors import UsageError
from tuner.paths import data_dir
from tuner.plan import fa_rules, space

DATA = Path(__file__).resolve().parents[2] / "data" / "render"
TREE_A = DATA / "treeA"
ARCH_ERAS = [(p.stem, era) for p in sorted(data_dir("search_spaces").glob("*.toml")) for era in ("mma", "rocwmma")]


@pytest.mark.parametrize(("arch", "era"), ARCH_ERAS)
def test_every_shipped_space_loads_and_defaults_are_allowed(arch: str, era: str) -> None:
    sp = space.load_space(arch, era)
    assert sp.variants, "first variant is the upstream default"
    for k in sp.knobs:
        assert k.coerce(k.default) == k.default
        dist = k.to_optuna_distribution()
        assert isinstance(dist, (od.CategoricalDistribution, od.IntDistribution))
        if isinstance(dist, od.CategoricalDistribution):
            assert k.default in dist.choices


def test_required_spaces_exist() -> None:
    names = {p.stem for p in data_dir("search_spaces").glob("*.toml")}
    assert {"cpu", "sm_89", "sm_90", "gfx1151"} <= names


@pytest.mark.parametrize("arch", ["sm_90", "sm_89", "gfx1151"])
def test_row_defaults_equal_tree_a_tables(arch: str) -> None:
    """Each table-row knob's default is the upstream value (read from the real tree-A header text)."""
    sp = space.load_space(arch, "mma")
    rows = [k for k in sp.compile_knobs if k.kind in ("tile_row", "mma_row")]
    assert rows
    for k in rows:
        m = k.meta
        row = space.upstream_row(TREE_A, k.kind, m["table"], (m["dkq"], m["dv"], m["ncols"]))
        assert getattr(row, m["field"]) == k.default, k.name


def test_nvidia_runtime_knobs_cover_the_contract() -> None:
    sp = space.load_space("sm_90", "mma")
    kinds = {k.kind for k in sp.runtime_knobs}
    assert kinds == {"rule", "threshold", "env", "bench_flag"}
    envs = {k.meta["env"] for k in sp.runtime_knobs if k.kind == "env"}
    assert envs == {"GGML_CUDA_GRAPH_OPT", "GGML_CUDA_PDL", "GGML_CUDA_DISABLE_FUSION"}
    assert {k.meta["id"] for k in sp.runtime_knobs if k.kind == "threshold"} == {1, 2, 3, 4}
    phases = {k.meta["phase"] for k in sp.runtime_knobs if k.kind == "rule"}
    assert phases == {"decode", "prefill"}


def test_cpu_space_varies_threads_ubatch_fa_per_era() -> None:
    a = space.load_space("cpu", "mma")
    b = space.load_space("cpu", "rocwmma")
    assert a.variants[0] == "cpu"
    assert {k.meta["flag"] for k in a.runtime_knobs} == {"-t", "-ub", "-fa"}
    assert a.knob("flash_attn").choices == ("on", "off")
    assert b.knob("flash_attn").choices == ("0", "1")  # tree B's -fa is a bool


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "x.toml"
    p.write_text(text)
    return p


GOOD = """
arch = "x"
[era.mma]
variants = ["cuda"]
[[era.mma.runtime]]
name = "T3"
kind = "threshold"
id = 3
choices = [8192, 4096]
default = 8192
"""


def test_unknown_key_names_file_and_suggests(tmp_path: Path) -> None:
    p = _write(tmp_path, GOOD.replace("id = 3", "id = 3\nchoises = [1]"))
    with pytest.raises(UsageError) as e:
        space.load_space("x", "mma", path=p)
    msg = str(e.value)
    assert (
        str(p) in msg and "'choises'" in msg and "Did you mean" in msg and "'choices'" in msg.split("Did you mean")[1]
    )


def test_bad_kind_lists_allowed(tmp_path: Path) -> None:
    p = _write(tmp_path, GOOD.replace('kind = "threshold"', 'kind = "threshhold"'))
    with pytest.raises(UsageError, match="allowed: rule, threshold, env, bench_flag"):
        space.load_space("x", "mma", path=p)


def test_default_not_in_choices_is_rejected(tmp_path: Path) -> None:
    p = _write(tmp_path, GOOD.replace("default = 8192", "default = 7"))
    with pytest.raises(UsageError, match="default 7 is not allowed"):
        space.load_space("x", "mma", path=p)


def test_missing_era_section(tmp_path: Path) -> None:
    p = _write(tmp_path, GOOD)
    with pytest.raises(space.SpaceNotFound, match=r"no \[era.rocwmma\]"):
        space.load_space("x", "rocwmma", path=p)


def test_unknown_arch_suggests() -> None:
    with pytest.raises(space.SpaceNotFound, match="Did you mean.*'sm_90'"):
        space.load_space("sm_09", "mma")


def test_int_range_distribution(tmp_path: Path) -> None:
    p = _write(tmp_path, GOOD.replace("choices = [8192, 4096]", "low = 1024\nhigh = 65536\nlog = true"))
    k = space.load_space("x", "mma", path=p).knob("T3")
    d = k.to_optuna_distribution()
    assert isinstance(d, od.IntDistribution) and d.log and (d.low, d.high) == (1024, 65536)
    with pytest.raises(UsageError, match="integers 1024..65536"):
        k.coerce(10)


def test_set_values_checked() -> None:
    sp = space.load_space("sm_90", "mma")
    cv, rv = space.parse_set_values(sp, ["mma.ampere.d64.c64.nthreads=256", "T3=4096", "rule.decode.16384-=MMA"])
    assert cv == {"mma.ampere.d64.c64.nthreads": 256}
    assert rv == {"T3": 4096, "rule.decode.16384-": "MMA"}
    with pytest.raises(UsageError, match="Did you mean 'T3'"):
        space.parse_set_values(sp, ["T33=1"])
    with pytest.raises(UsageError, match="Allowed: 128, 64, 256"):
        space.parse_set_values(sp, ["mma.ampere.d64.c64.nthreads=96"])
    with pytest.raises(UsageError, match="KNOB=VALUE"):
        space.parse_set_values(sp, ["T3"])


def test_render_runtime_env_and_args() -> None:
    sp = space.load_space("sm_90", "mma")
    rs = space.render_runtime(
        sp,
        {
            "rule.decode.16384-": "MMA",
            "rule.prefill.0-4096": "TILE",
            "T3": 4096,
            "T1": 4,
            "cuda_graph_opt": 1,
            "ubatch": 1024,
        },
    )
    assert rs.env == {
        "GGML_TUNER_FA_T3": "4096",
        "GGML_CUDA_GRAPH_OPT": "1",
        "GGML_TUNER_FA_RULES": "decode:16384-=MMA,prefill:0-4096=TILE",
    }
    assert rs.bench_args == ("-ub", "1024")
    assert space.render_runtime(sp, sp.defaults("runtime")).env == {}  # the baseline sets nothing


def test_parse_fa_rules_roundtrip_and_errors() -> None:
    rules = fa_rules.parse_fa_rules("decode:0-8192=VEC, prefill:4096-=MMA")
    assert [r.text for r in rules] == ["decode:0-8192=VEC", "prefill:4096-=MMA"]
    assert rules[1].hi is None
    for bad in ("decode:0-8192=WMMA", "decode:8192-0=VEC", "prefil:0-=VEC", "decode 0-1=VEC"):
        with pytest.raises(UsageError):
            fa_rules.parse_fa_rules(bad)


def test_parse_fa_rules_shape_keys_roundtrip() -> None:
    rules = fa_rules.parse_fa_rules("decode/D64/gqa4/kvf16:32768-=MMA,prefill/kvq8_0/gqa8:0-4096=TILE,decode:0-=VEC")
    assert [r.text for r in rules] == [
        "decode/D64/gqa4/kvf16:32768-=MMA",
        "prefill/gqa8/kvq8_0:0-4096=TILE",
        "decode:0-=VEC",
    ]
    assert (rules[0].D, rules[0].gqa, rules[0].kv) == (64, 4, "f16")
    assert (rules[1].D, rules[1].gqa, rules[1].kv) == (None, 8, "q8_0")
    assert (rules[2].D, rules[2].gqa, rules[2].kv, rules[2].key) == (None, None, None, "")
    for r in rules:
        assert fa_rules.parse_fa_rules(r.text) == (r,)  # text round-trips
    for kv in fa_rules.FA_RULE_KV_TYPES:
        assert fa_rules.parse_fa_rules(f"decode/kv{kv}:0-=TILE")[0].kv == kv
    assert fa_rules.parse_fa_rules("decode/D1/gqa1:0-=TILE")[0].D == 1
    assert fa_rules.parse_fa_rules("decode/D4096/gqa256:0-=TILE")[0].gqa == 256


@pytest.mark.parametrize(
    ("bad", "msg"),
    [
        ("decode/D0:0-=MMA", r"D0 is out of range; D must be in \[1, 4096\]"),
        ("decode/D4097:0-=MMA", r"D must be in \[1, 4096\]"),
        ("decode/gqa0:0-=MMA", r"gqa must be in \[1, 256\]"),
        ("decode/gqa257:0-=MMA", r"gqa must be in \[1, 256\]"),
        ("decode/kvf61:0-=MMA", r"K/V type 'f61' is not one of f32, f16, bf16.*Did you mean"),
        ("decode/kvq4_K:0-=MMA", r"shape key 'kvq4_K' is not D<int>, gqa<int>, kv<type> or nb<int>"),
        ("decode/kvq4_k:0-=MMA", r"K/V type 'q4_k' is not one of"),
        (
            "decode/hd64:0-=MMA",
            r"shape key 'hd64' is not D<int>, gqa<int>, kv<type> or nb<int>\. Rules are PHASE\[/KEY\.\.\.\]",
        ),
        ("decode/d64:0-=MMA", r"shape key 'd64'"),
        ("decode/D:0-=MMA", r"shape key 'D'"),
        ("decode/D-1:0-=MMA", r"shape key 'D-1'"),
        ("decode/:0-=MMA", r"shape key ''"),
        ("decode/D64/D128:0-=MMA", r"shape key D is given twice"),
        ("decode/gqa4/gqa4:0-=MMA", r"shape key gqa is given twice"),
        ("/D64:0-=MMA", r"is not phase:lo-hi=KERNEL"),
        ("decode:0-=MMA/D64", r"is not phase:lo-hi=KERNEL"),
    ],
)
def test_parse_fa_rules_bad_shape_keys(bad: str, msg: str) -> None:
    with pytest.raises(UsageError, match=msg):
        fa_rules.parse_fa_rules(bad)


def test_match_rules_unmatched_shape_gets_upstream() -> None:
    """A rule found on one model shape (1B: D64, GQA 4, f16 KV) never changes another shape's kernel."""
    rules = fa_rules.parse_fa_rules("decode/D64/gqa4/kvf16:32768-=MMA,decode/D128/gqa4:16384-65536=TILE,prefill:0-=MMA")
    one_b = dict(D=64, gqa=4, kv="f16")
    assert match_rules(rules, "decode", 32768, **one_b) is rules[0]
    assert match_rules(rules, "decode", 1 << 20, **one_b) is rules[0]  # hi empty: unbounded
    assert match_rules(rules, "decode", 32767, **one_b) is None  # below lo: upstream's choice
    assert match_rules(rules, "decode", 32768, D=128, gqa=8, kv="f16") is None  # other model: upstream
    assert match_rules(rules, "decode", 32768, D=64, gqa=8, kv="f16") is None
    assert match_rules(rules, "decode", 32768, D=64, gqa=4, kv="q8_0") is None
    assert match_rules(rules, "decode", 32768, D=64, gqa=4, kv="f16", kv_v="q8_0") is None  # K and V both
    # a missing key matches any value: rule 1 has no kv key, rule 2 no key at all
    assert match_rules(rules, "decode", 16384, D=128, gqa=4, kv="q8_0") is rules[1]
    assert match_rules(rules, "decode", 65536, D=128, gqa=4, kv="q8_0") is None  # hi is exclusive
    assert match_rules(rules, "prefill", 0, D=256, gqa=1, kv="bf16") is rules[2]
    assert match_rules([], "decode", 0, **one_b) is None
    # first match wins, as in fattn-tail.cu.j2
    both = fa_rules.parse_fa_rules("decode/gqa4:0-=TILE,decode:0-=VEC")
    assert match_rules(both, "decode", 100, **one_b) is both[0]
    assert match_rules(both, "decode", 100, D=64, gqa=8, kv="f16") is both[1]


def test_compile_value_must_be_compile_knob() -> None:
    sp = space.load_space("sm_90", "mma")
    with pytest.raises(UsageError, match="runtime knob"):
        space.check_values(sp, {"T3": 4096}, section="compile")


def test_shipped_files_parse_as_toml() -> None:
    for p in data_dir("search_spaces").glob("*.toml"):
        assert tomllib.loads(p.read_text())["arch"] == p.stem


def test_set_pins_checks_the_variant_as_search_and_its_dry_run_both_do() -> None:
    sp = space.load_space("sm_90", "mma")
    assert space.set_pins(sp, {"variant": sp.variants[0]}) == ({}, {})  # the variant is a build, no knob
    with pytest.raises(
        UsageError, match=r"variant=cudaa is not a variant of the sm_90 space.*Did you mean one of 'cuda'"
    ):
        space.set_pins(sp, {"variant": "cudaa"})
