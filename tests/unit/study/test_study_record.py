"""tuner.study's record is a typed view on what the stored studies hold (each result's
results/*/evidence/study.db.xz, the earlier states in docs/data/noise-floors/, tests/data/studies/): every
stored study loads, its outcome writes back to the very JSON it was read from, and a record written through
StudyState reads back equal."""

from __future__ import annotations

import dataclasses
import functools
import json
import lzma
import re
import sqlite3
import tempfile
from pathlib import Path

import optuna
import pytest

from tuner.errors import TunerError
from tuner.plan.fa_rules import FaRule, parse_fa_rules
from tuner.study import state as keys
from tuner.study.record import SearchOutcome, StudyHeader, TunedTrial, load_outcome
from tuner.study.state import StudyState

REPO = Path(__file__).resolve().parents[3]
STORED = ("results", "docs/data", "tests/data/studies")
"""Where the repository keeps study databases, xz-compressed (tools/aa_floors.py reads the same ones)."""


def _reexported() -> list[tuple[str, Path]]:
    """(study, compressed database) of every stored result, as tools/reexport-results.sh exports them."""
    text = (REPO / "tools" / "reexport-results.sh").read_text()
    found = re.findall(r"^export_one (\S+) (\S+) ", text, flags=re.MULTILINE)
    assert len(found) >= 5, text  # the script's format changed: this test must follow it
    out = [(name, REPO / "results" / folder / "evidence" / "study.db.xz") for folder, name in found]
    assert all(xz.is_file() for _, xz in out), out
    return out


_TMP = tempfile.TemporaryDirectory(prefix="tuner-test-studies-")


@functools.cache
def _plain(xz: Path) -> Path:
    """``xz`` decompressed into a temporary file (SQLite reads only a plain file), once per test run."""
    db = Path(_TMP.name) / f"{len(list(Path(_TMP.name).iterdir()))}-{xz.name.removesuffix('.xz')}"
    db.write_bytes(lzma.decompress(xz.read_bytes()))
    return db


def _stored(xz: Path) -> list[tuple[str, dict[str, str]]]:
    """(study, {attribute: its stored JSON text}) of each study in ``xz``, read with sqlite3 (not Optuna)."""
    con = sqlite3.connect(f"file:{_plain(xz)}?mode=ro", uri=True)
    try:
        out = []
        for sid, name in con.execute("select study_id, study_name from studies"):
            out.append(
                (
                    name,
                    dict(con.execute("select key, value_json from study_user_attributes where study_id = ?", (sid,))),
                )
            )
        return out
    finally:
        con.close()


def _finished_pipeline_studies() -> list[tuple[str, Path]]:
    """Every stored pipeline study that finished its confirm stage (older tuner versions made most)."""
    out = []
    for xz in sorted(xz for d in STORED for xz in (REPO / d).rglob("*.db.xz")):
        out += [(name, xz) for name, attrs in _stored(xz) if keys.PIPELINE in attrs and keys.RESULT in attrs]
    return out


def _load(name: str, xz: Path) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name=name, storage=f"sqlite:///{_plain(xz)}")


@pytest.mark.parametrize(("name", "db"), _reexported(), ids=lambda x: str(x).rsplit("/", 1)[-1])
def test_every_reexported_study_loads_with_its_stored_layout(name: str, db: Path) -> None:
    attrs = dict(_stored(db))[name]
    out = load_outcome(_load(name, db))
    # the record writes back the very JSON text the study holds: a view on it, not a new format
    assert json.dumps(out.result_json()) == attrs[keys.RESULT]
    stored = json.loads(attrs[keys.RESULT])
    assert all(isinstance(r, FaRule) for r in out.rules) and out.rule_texts == stored["rules"]
    assert [r.text for r in out.dropped] == list(stored["dropped"])
    assert out.rows == tuple(stored["rows"]) and out.upstream_phases == tuple(stored["upstream_phases"])
    assert (out.tuned.stored() if out.tuned else None) == stored["tuned"]
    assert out.gate == stored.get("gate") and out.residency == stored.get("residency")
    h = out.header
    assert h.name == name and h.pipeline == 2 and h.arch == json.loads(attrs["arch"])
    assert list(h.depths) == json.loads(attrs["depths"]) and (h.pp, h.tg) == (
        json.loads(attrs["pp"]),
        json.loads(attrs["tg"]),
    )
    assert h.model == json.loads(attrs["model"]) and dict(h.shape) == json.loads(attrs["shape"])
    assert h.source_id == json.loads(attrs["source_id"]) and h.device == json.loads(attrs["device"])
    assert out.stage_seconds == json.loads(attrs["stage_seconds"]) and out.op_checks == json.loads(attrs["gates"])
    assert {p: dict(c) for p, c in out.screens.items()} == {p: json.loads(attrs[f"screen_{p}"]) for p in ("tg", "pp")}
    assert len(out.trials) == len(_load(name, db).get_trials(deepcopy=False))


def test_every_finished_stored_study_loads() -> None:
    """Older studies too (the earlier states in docs/data/noise-floors/, tests/data/studies/): each result
    reads back to its stored JSON."""
    studies = _finished_pipeline_studies()
    assert len(studies) >= len(_reexported())
    for name, db in studies:
        out = load_outcome(_load(name, db))
        assert json.dumps(out.result_json()) == dict(_stored(db))[name][keys.RESULT], db


def test_an_unfinished_study_says_to_resume() -> None:
    db = REPO / "docs" / "data" / "noise-floors" / "sm90-l1b-v3.1.db.xz"  # screened, not yet confirmed
    assert keys.RESULT not in dict(_stored(db))["sm90-l1b-v3"]
    with pytest.raises(TunerError, match="has not finished its confirm stage yet; rerun the same `tuner search`"):
        load_outcome(_load("sm90-l1b-v3", db))


def _write(st: StudyState, out: SearchOutcome) -> None:
    """What the search writes over its stages, through StudyState only."""
    h = out.header
    st.record_header(h.stored())
    st.set_derived_knobs(h.derived_knobs)
    if h.device is not None:
        st.set_device(h.device)
    st.set_toolchain(h.toolchain)
    st.set_gates(out.op_checks)
    for stage, secs in out.stage_seconds.items():
        st.add_seconds(stage, secs)
    for phase, cells in out.screens.items():
        st.set_screen(phase, cells)
    st.set_compose(out.compose)
    st.set_screen_method(out.screen_method)
    st.set_tune_method(out.tune_method)
    if out.llama_bench_calls is not None:
        st.add_llama_bench_calls(out.llama_bench_calls)
    st.set_result(out.result_json())


@pytest.mark.parametrize(("name", "db"), _reexported(), ids=lambda x: str(x).rsplit("/", 1)[-1])
def test_a_record_written_through_study_state_reads_back_equal(name: str, db: Path) -> None:
    before = load_outcome(_load(name, db))
    study = optuna.create_study(study_name=name)  # in memory
    _write(StudyState(study), before)
    after = load_outcome(study)
    # a search never writes seeded_from (a one-off script that seeded sm90-l1b-v3 did) and the fresh study has no trials
    assert after == dataclasses.replace(before, header=dataclasses.replace(before.header, seeded_from=None), trials=())


def test_a_crafted_outcome_round_trips_with_every_field() -> None:
    """Fields the stored results leave empty (dropped rules, a tuned trial, a pinned mask) round-trip too."""
    h = StudyHeader(
        name="rt",
        pipeline=2,
        arch="sm_90",
        model="/m/x.gguf",
        shape={"head_dim": 64},
        depths=(0, 4096),
        pp=512,
        tg=128,
        source_spec="pypi:x",
        source_id="s1",
        commit="abc",
        era="mma",
        profile="per-phase",
        cpu_mask=(0, 1),
        device="GPU",
        toolchain={"cc": "gcc"},
        derived_knobs={"threads": {"values": [1, 2]}},
    )
    rules = tuple(parse_fa_rules("decode/D64/gqa4/kvf16:32768-=TILE,prefill:0-4096=MMA"))
    out = SearchOutcome(
        header=h,
        rules=rules[:1],
        dropped={rules[1]: "slower at d0"},
        tuned=TunedTrial(trial=3, values={"threads": 1, "variant": "mma"}, params={"threads": 1}),
        rows=({"phase": "tg", "depth": 0, "verdict": "faster", "speedup": 1.1},),
        attempt=1,
        upstream_phases=("pp",),
        confirm_depths=(0, 2048, 4096),
        gate={"verdict": "pass", "checks": []},
        residency={"verdict": "pass", "upstream": {}},
        op_checks={"b1": {"status": "pass"}},
        screens={"tg": {"0": {"noise_pct": 1.0}}, "pp": {}},
        compose={"rules": [rules[0].text], "decisions": [], "shape": "D64"},
        stage_seconds={"screen": 12.5},
    )
    study = optuna.create_study(study_name="rt")
    _write(StudyState(study), out)
    assert load_outcome(study) == out
    assert StudyState(study).result()["dropped"] == {"prefill:0-4096=MMA": "slower at d0"}  # the stored layout
