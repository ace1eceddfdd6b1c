"""plot_speedup, dashboard_command (with a real optuna-dashboard on a stored study) and importances_section."""

from __future__ import annotations

import json
import lzma
import shlex
from pathlib import Path

import optuna
import pytest

from tuner.errors import UsageError
from tuner.result.plots import plot_speedup
from tuner.result.report import dashboard_command, importances_section

REPO = Path(__file__).resolve().parents[3]
STUDY_DB = REPO / "tests" / "data" / "studies" / "sm90-study.db.xz"
STUDY_NAME = "sm90-llama-3.2-1b-q4km"


def _points(phases: tuple[str, ...] = ("pp", "tg"), depths: tuple[int, ...] = (0, 4096, 16384, 65536)) -> list[dict]:
    pts = []
    for phase in phases:
        for i, d in enumerate(depths):
            sp = 1 + 0.02 * i
            pts.append(
                {
                    "phase": phase,
                    "depth": d,
                    "test": "pp512" if phase == "pp" else "tg128",
                    "base_ts": 1000.0 - 100 * i,
                    "tuned_ts": (1000.0 - 100 * i) * sp,
                    "speedup": sp,
                    "ci_low": sp - 0.015,
                    "ci_high": sp + (3.0 if i == 0 else 0.015),
                    "aa_noise_pct": 1.0 + i,
                    "verdict": "faster" if i == 3 else "no difference",
                    "upstream_kernel": "VEC",
                    "kernel": "MMA" if (phase == "tg" and i >= 2) else "VEC",
                }
            )
    return pts


def test_plot_speedup_writes_png(tmp_path: Path) -> None:
    png = plot_speedup(_points(), tmp_path / "a" / "speedup.png", title="example")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20000
    # one phase, no noise, no kernels, missing CI
    pts = [
        dict(p, aa_noise_pct=None, kernel=None, upstream_kernel=None, ci_low=float("nan"))
        for p in _points(("tg",), (0, 512))
    ]
    assert plot_speedup(pts, tmp_path / "b.png").is_file()
    with pytest.raises(UsageError):
        plot_speedup([], tmp_path / "c.png")


def test_dashboard_command_quotes_and_absolutizes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cmd = dashboard_command("sqlite:///runs/my study.db")
    argv = shlex.split(cmd)
    assert argv == ["optuna-dashboard", f"sqlite:///{tmp_path / 'runs' / 'my study.db'}"]
    assert dashboard_command("sqlite:////abs/s.db") == "optuna-dashboard sqlite:////abs/s.db"
    pg = dashboard_command("postgresql+psycopg://tuner:s3cret@db.lan:5433/optuna")
    assert pg == "optuna-dashboard postgresql+psycopg://tuner@db.lan:5433/optuna" and "s3cret" not in pg


def test_dashboard_opens_stored_study(tmp_path: Path) -> None:
    """The printed command's storage, opened through optuna-dashboard's WSGI app, lists the study."""
    dash = pytest.importorskip(
        "optuna_dashboard", reason="optuna-dashboard not installed (pip install 'tuner[dashboard]')"
    )
    from wsgiref.util import setup_testing_defaults

    db = tmp_path / "study copy.db"
    db.write_bytes(lzma.decompress(STUDY_DB.read_bytes()))
    storage_url = shlex.split(dashboard_command(f"sqlite:///{db}"))[1]
    storage = optuna.storages.RDBStorage(storage_url)
    try:
        app = dash.wsgi(storage)
        environ: dict = {}
        setup_testing_defaults(environ)
        environ.update(REQUEST_METHOD="GET", PATH_INFO="/api/studies")
        status: list[str] = []
        body = b"".join(app(environ, lambda s, headers, exc_info=None: status.append(s)))
    finally:
        storage.remove_session()
        storage.engine.dispose()
    assert status == ["200 OK"]
    names = [s["study_name"] for s in json.loads(body)["study_summaries"]]
    assert STUDY_NAME in names


def _study(values: list[tuple[float, str, float]]) -> optuna.Study:
    from optuna.distributions import CategoricalDistribution, FloatDistribution
    from optuna.trial import create_trial

    study = optuna.create_study(direction="maximize", study_name="t")
    dist = {"x": FloatDistribution(0, 10), "k": CategoricalDistribution(["VEC", "MMA"])}
    for x, k, v in values:
        study.add_trial(create_trial(params={"x": x, "k": k}, distributions=dist, value=v))
    return study


def test_importances_section_table_and_reasons() -> None:
    rows = [(float(x), "VEC" if x % 2 else "MMA", 10.0 * x + (0.1 if x % 2 else 0.0)) for x in range(8)]
    md = importances_section(_study(rows))
    lines = md.splitlines()
    assert lines[0].startswith("Parameter importances (Optuna PED-ANOVA over 8 complete trials")
    assert lines[2].startswith("| parameter") and lines[4].split("|")[1].strip() == "x"
    assert {ln.split("|")[1].strip() for ln in lines[4:]} == {"x", "k"}
    only_k = importances_section(_study(rows), params=["k"])
    assert "| k " in only_k and "| x " not in only_k

    assert (
        importances_section(_study(rows[:3]))
        == "Parameter importances: not computed (3 complete trials; need at least 4)."
    )
    same = importances_section(_study([(1.0, "VEC", float(v)) for v in range(5)]))
    assert same.startswith("Parameter importances: not computed (no parameter took 2 or more values")
    assert "\n" not in same


def test_importances_per_objective_of_a_two_objective_study() -> None:
    import optuna

    from tuner.result.report import importances_section

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    st = optuna.create_study(directions=["maximize", "maximize"], sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(12):
        t = st.ask(
            {
                "ub": optuna.distributions.CategoricalDistribution([256, 512, 1024]),
                "graph": optuna.distributions.CategoricalDistribution([0, 1]),
            }
        )
        st.tell(t, [1.0 + t.params["ub"] / 1e4, 1.0 + 0.05 * t.params["graph"]])  # pp follows ub, tg follows graph
    assert "multi-objective" in importances_section(st)
    pp = importances_section(st, objective=0, target_name="pp")
    tg = importances_section(st, objective=1, target_name="tg")
    assert "for pp" in pp and "for tg" in tg and "| ub" in pp and "| graph" in tg

    # a decode-only tune: the prefill objective is 1.0 in every trial, so no importance is claimed for it
    dec = optuna.create_study(directions=["maximize", "maximize"], sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(8):
        t = dec.ask({"nthreads": optuna.distributions.CategoricalDistribution([64, 128, 256])})
        dec.tell(t, [1.0, 1.0 - t.params["nthreads"] / 1e4])
    assert "not computed (its value is the same in all 8 complete trials" in importances_section(
        dec, objective=0, target_name="pp"
    )
    assert "| nthreads" in importances_section(dec, objective=1, target_name="tg")


def test_importances_rank_by_reaching_the_highest_speedups() -> None:
    """PED-ANOVA takes a given target as lower-is-better; a maximized objective must be negated.

    Only ``k`` = J lifts the second objective (the top 10% of trials are exactly the J ones); ``z``
    alone orders the rest. Read as lower-is-better, ``z`` would rank first (it decides the lowest
    trials); read the right way round, ``k`` does.
    """
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    from tuner.result.report import importances_section

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    st = optuna.create_study(directions=["maximize", "maximize"])
    letters = list("ABCDEFGHIJ")
    dist = {"k": CategoricalDistribution(letters), "z": FloatDistribution(0, 1)}
    for i in range(60):
        k, z = letters[i % 10], ((i * 37) % 60) / 60
        tg = 1.0 + (0.5 if k == "J" else 0.0) + 0.01 * z
        st.add_trial(optuna.trial.create_trial(params={"k": k, "z": z}, distributions=dist, values=[1.0, tg]))
    md = importances_section(st, objective=1, target_name="tg")
    rows = [ln.split("|")[1].strip() for ln in md.splitlines() if ln.startswith("| ") and "parameter" not in ln]
    assert rows == ["k", "z"], md
    assert "achieve low `target` values" not in md
