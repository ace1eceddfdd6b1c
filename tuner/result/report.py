"""Markdown reports and depth plots from bench frames. Every comparison is one table of
:mod:`tuner.result.tables` (compare-llama-bench.py's shape plus CI, noise reference and verdict) judged by one
rule (:func:`tuner.measure.stats.judge`): no faster/slower without a noise reference, an A/A pair (``--aa``) or
else the recorded run-to-run floor of the backend and phase (docs/noise-floors.md).
"""

from __future__ import annotations

import math
import shlex
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from tuner import log
from tuner.errors import UsageError, close_matches
from tuner.measure.frames import same_build
from tuner.measure.stats import NoiseRef, Verdict, aa_noise, compare, judge, run_floor
from tuner.result.tables import (
    ESTIMATORS,
    CompareRecord,
    Points,
    as_float,
    bench_test_name,
    compare_records,
    compare_table,
    method_paragraph,
)

if TYPE_CHECKING:
    import optuna
    import pandas as pd

    Row = pd.Series[Any]
    """One bench row (a frame's row)."""
    Frames = Mapping[str, pd.DataFrame]
    """Bench frames by variant label."""
    AAPair = tuple[pd.DataFrame, pd.DataFrame]
    """Two runs of one build (``--aa``): their difference is the noise a change must clear."""


Point = tuple[str, str, int]
"""(model, test, depth): one point of a comparison."""


def _groups(df: pd.DataFrame) -> dict[Point, Row]:
    models = df["model"] if "model" in df.columns else [""] * len(df)
    return {(str(m), str(r["test"]), int(r["depth"])): r for m, (_, r) in zip(models, df.iterrows())}


def _one_model(ga: Mapping[Point, Row], gb: Mapping[Point, Row]) -> dict[Point, Row]:
    """B's keys renamed to A's model when each side holds one model (a tuner file names it by file, a
    raw llama-bench file by model type: the same model either way)."""
    ma, mb = {k[0] for k in ga}, {k[0] for k in gb}
    if len(ma) == 1 and len(mb) == 1 and ma != mb:
        (m,) = ma
        return {(m, t, d): r for (_, t, d), r in gb.items()}
    return dict(gb)


def _backend(*frames: pd.DataFrame | None) -> str | None:
    for df in frames:
        if df is not None and "backends" in df.columns and df["backends"].notna().any():
            return str(df["backends"].dropna().iloc[0])
    return None


def _samples(r: Row | None) -> list[float]:
    return list(r["samples"]) if r is not None and r["samples"] is not None else []


def _anchor_ts(r: Row | None) -> float:
    """compare-llama-bench.py's t/s of a row: a raw llama-bench file's ``avg_ts`` (the mean over its rows of
    llama-bench's avg_ts), else, for a `tuner bench` row, the mean of the repetitions its median is taken of."""
    if r is None:
        return math.nan
    avg = as_float(r.get("avg_ts"))
    if math.isfinite(avg):
        return avg
    s = [x for x in _samples(r) if math.isfinite(x)]
    return sum(s) / len(s) if s else math.nan


def compare_points(
    df_a: pd.DataFrame,
    df_b: pd.DataFrame,
    *,
    aa: AAPair | None = None,
    confidence: float = 0.95,
    min_effect_pct: float = 0.0,
    seed: int = 0,
) -> list[dict[str, object]]:
    """Points for :func:`compare_table` / :func:`plot_speedup` from two bench frames: per model, test and depth,
    :func:`tuner.measure.stats.compare` of the repetitions, judged against ``aa``'s reach at that point (two runs
    of one build here) or else :func:`tuner.measure.stats.run_floor`. ``base_ts``/``tuned_ts`` are
    compare-llama-bench.py's t/s (:func:`_anchor_ts`); ``speedup`` is of the medians the CI is of."""
    ga, gb = _groups(df_a), _groups(df_b)
    gb = _one_model(ga, gb)
    gaa = None if aa is None else (_one_model(ga, _groups(aa[0])), _one_model(ga, _groups(aa[1])))
    backend = _backend(df_a, df_b)
    pts = []
    for key in sorted(set(ga) | set(gb), key=lambda k: (k[0], k[1][:2], k[1], k[2])):
        model, test, depth = key
        ra, rb = ga.get(key), gb.get(key)
        phase = str((ra if ra is not None else gb[key])["phase"])  # the key came from one of the two
        base = as_float(ra["median_ts"]) if ra is not None else math.nan
        new = as_float(rb["median_ts"]) if rb is not None else math.nan
        noise = run_floor(backend, phase)
        if gaa is not None and key in gaa[0] and key in gaa[1]:
            va = compare(_samples(gaa[0][key]), _samples(gaa[1][key]), confidence=confidence, seed=seed)
            noise = NoiseRef(pct=aa_noise(va), kind="A/A", source="the A/A pair given with --aa")
        if ra is None or rb is None:
            nan = math.nan
            v = Verdict(
                delta_pct=nan, ci_low=nan, ci_high=nan, p_value=nan, verdict="no difference", confidence=confidence
            )
            verdict = "missing"
        else:
            v = compare(_samples(ra), _samples(rb), confidence=confidence, seed=seed, min_effect_pct=min_effect_pct)
            verdict = judge(v, noise, min_effect_pct=min_effect_pct)
        pts.append(
            {
                "model": model,
                "phase": phase,
                "depth": depth,
                "test": test,
                # the t/s shown: compare-llama-bench.py's mean; the CI and verdict: tuner's medians
                "base_ts": _anchor_ts(ra),
                "tuned_ts": _anchor_ts(rb),
                "base_median_ts": base,
                "tuned_median_ts": new,
                "speedup": new / base if base > 0 else math.nan,
                "ci_low": 1 + v.ci_low / 100,
                "ci_high": 1 + v.ci_high / 100,
                "p_value": v.p_value,
                "aa_noise_pct": noise.pct if math.isfinite(noise.pct) else None,
                "noise_kind": noise.kind,
                "noise_source": noise.source,
                "verdict": verdict,
                "upstream_kernel": None,
                "kernel": None,
            }
        )
    return pts


def noise_line(points: Points) -> str:
    """One sentence on the noise references ``points`` were judged against (for stderr and the method)."""
    srcs = sorted({str(p.get("noise_source")) for p in points if p.get("noise_source")})
    kinds = {p.get("noise_kind") for p in points}
    if kinds == {"A/A"}:
        return "each row's A/A noise is how far the A/A pair given with --aa differs at that point (its CI's reach from 0)."
    out = "; ".join(srcs) + "."
    if "floor" in kinds or "none" in kinds:
        out += (
            " A floor is what separate runs of one build differed by on recorded machines, not on this one: "
            "pass --aa A1 A2 (two runs of the A build) to judge by this machine's own noise."
        )
    return out


def aa_warning(df_a: pd.DataFrame, df_b: pd.DataFrame) -> str:
    """The warning for an A/A comparison (both sides one build, one command), or ``""``."""
    why = same_build(df_a, df_b)
    if not why:
        return ""
    if "binary" in why:
        return (
            f"this is an A/A comparison: {why}. Any difference below is run-to-run noise, not a change; "
            "compare two different builds (or use these two files as --aa)."
        )
    return (
        f"this looks like an A/A comparison: {why}. Unless the two differ in something llama-bench does not record "
        "(an environment variable, uncommitted source changes, CMake flags), any difference below is run-to-run "
        "noise, not a change."
    )


def _intro(frames: Frames, labels: Sequence[str], baseline: str) -> list[str]:
    """Model, backend and GPU of the baseline's first row, and the variants with their commits."""
    base_df = frames[baseline]
    if not len(base_df):
        return []
    meta = base_df.iloc[0]
    size, params = as_float(meta.get("model_size")), as_float(meta.get("n_params"))
    bits = [f"model `{Path(str(meta.get('model_filename'))).name}`"]
    if math.isfinite(size):
        bits.append(f"{size / 2**20:.2f} MiB")
    if math.isfinite(params):
        bits.append(f"{params / 1e9:.2f} B params")
    bits.append(f"backend {meta.get('backends') or '?'}")
    if meta.get("gpu_info"):
        bits.append(str(meta.get("gpu_info")))
    out = [", ".join(bits) + ".", ""]
    commits = {
        k: sorted({str(c) for c in frames[k]["build_commit"].dropna()}) if "build_commit" in frames[k] else []
        for k in labels
    }
    variants = "; ".join(f"**{k}**" + (f" (llama.cpp {', '.join(c)})" if c else "") for k, c in commits.items())
    return [*out, f"Variants: {variants}. Baseline: **{baseline}**.", ""]


def _roofline(frames: Frames, labels: Sequence[str]) -> list[str]:
    """Measured t/s as a share of the roofline model estimate, where the frames carry one."""
    has = [
        k
        for k in labels
        if "roofline_pct" in frames[k] and frames[k]["roofline_pct"].map(as_float).map(math.isfinite).any()
    ]
    if not has:
        return ["roofline %: not available (run `tuner bench` with --arch or --bandwidth).", ""]
    idx = {k: _groups(frames[k]) for k in has}
    keys = sorted({key for k in has for key in idx[k]}, key=lambda t: (t[0], t[1][:2], t[1], t[2]))
    rows = [
        [bench_test_name(t, d)]
        + [f"{as_float(idx[k][(m, t, d)]['roofline_pct']):.1f}" if (m, t, d) in idx[k] else "-" for k in has]
        for m, t, d in keys
    ]
    return [
        "## Roofline",
        "",
        log.table(["Test"] + [f"roofline % {k}" for k in has], rows),
        "",
        "roofline %: measured / model estimate (tg: bandwidth / bytes per token; pp: compute peak). "
        "A model estimate, not a measurement.",
        "",
    ]


def _pairs(
    frames: Frames, baseline: str, *, aa: AAPair | None, confidence: float, seed: int
) -> list[tuple[str, list[dict[str, object]]]]:
    if not frames:
        raise UsageError("No bench results to report; pass at least one results file.")
    if baseline not in frames:
        raise UsageError(
            f"Baseline {baseline!r} is not among the variants {sorted(frames)}." + close_matches(baseline, list(frames))
        )
    return [
        (k, compare_points(frames[baseline], frames[k], aa=aa, confidence=confidence, seed=seed))
        for k in frames
        if k != baseline
    ]


def render_report(
    frames: Frames,
    baseline: str,
    *,
    aa: AAPair | None = None,
    confidence: float = 0.95,
    seed: int = 0,
    title: str = "llama-bench results",
) -> str:
    """Markdown: one :func:`compare_table` per variant against ``baseline``, the method, the roofline;
    UsageError for an unknown baseline or no frames."""
    pairs = _pairs(frames, baseline, aa=aa, confidence=confidence, seed=seed)
    labels = [baseline] + [k for k, _ in pairs]
    out = [f"# {title}", ""] + _intro(frames, labels, baseline)
    for k, pts in pairs:
        out += [f"## {k} vs {baseline}", ""]
        if warn := aa_warning(frames[baseline], frames[k]):
            out += [f"**Note: {warn}**", ""]
        out += [compare_table(pts, name_a=baseline, name_b=k), "", ESTIMATORS, ""]
    if not pairs:
        out += ["Only one variant: nothing to compare.", ""]
    all_pts = [p for _, pts in pairs for p in pts]
    out += ["## Method", "", method_paragraph("separate runs", confidence=confidence, noise=noise_line(all_pts)), ""]
    if drifted := [k for k in labels if "drift_corrected" in frames[k] and frames[k]["drift_corrected"].eq(True).any()]:
        out += ["Drift-corrected by the interleaved baseline anchor: " + ", ".join(drifted) + ".", ""]
    out += _roofline(frames, labels)
    return "\n".join(out)


def report_records(
    frames: Frames, baseline: str, *, aa: AAPair | None = None, confidence: float = 0.95, seed: int = 0
) -> list[CompareRecord]:
    """``tuner report --json``: the records of every table of :func:`render_report`."""
    return [
        rec
        for k, pts in _pairs(frames, baseline, aa=aa, confidence=confidence, seed=seed)
        for rec in compare_records(pts, name_a=baseline, name_b=k)
    ]


# -- Optuna's ecosystem --------------------------------------------------------------------------


def dashboard_command(storage_url: str) -> str:
    """``optuna-dashboard <storage>``, shell-quoted: a relative SQLite path made absolute (it works from any
    folder), a password left out (it would land in logs; PostgreSQL takes it from ``PGPASSWORD`` or ``~/.pgpass``)."""
    url = str(storage_url)
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///") :]
        if path and path != ":memory:" and not path.startswith("/"):
            url = "sqlite:///" + str(Path(path).resolve())
    else:
        parts = urlsplit(url)
        if parts.password is not None:
            host = parts.hostname or ""
            if parts.port:
                host += f":{parts.port}"
            user = parts.username or ""
            url = urlunsplit(parts._replace(netloc=f"{user}@{host}" if user else host))
    return f"optuna-dashboard {shlex.quote(url)}"


def importances_section(
    study: optuna.Study,
    params: Sequence[str] | None = None,
    *,
    min_trials: int = 4,
    objective: int | None = None,
    target_name: str = "",
) -> str:
    """Optuna's parameter importances (``get_param_importances``, normalized) as a Markdown table, or one line
    saying why not: it needs ``min_trials`` COMPLETE trials and a parameter (of ``params``, default all) that
    took 2 or more values; a multi-objective study needs ``objective`` (a value's index), named ``target_name``."""
    import optuna  # heavy: only a study's report needs it, not `tuner report` over bench files
    from optuna.trial import TrialState

    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    skip = "Parameter importances: not computed ({})."
    if len(study.directions) != 1 and objective is None:
        return skip.format("multi-objective study")
    target = None
    if objective is not None:
        # PED-ANOVA ranks by "lower is better" whenever a target is given, whatever the study's
        # direction; our objectives are speedups (maximized), so the value is negated for it.
        sign = -1.0 if study.directions[objective] == optuna.study.StudyDirection.MAXIMIZE else 1.0
        target = lambda t: sign * t.values[objective]  # noqa: E731
    if len(done) < min_trials:
        return skip.format(f"{len(done)} complete trial{'' if len(done) == 1 else 's'}; need at least {min_trials}")
    if objective is not None and len({t.values[objective] for t in done}) < 2:
        # e.g. the prefill objective of a decode-only tune: every trial reports 1.0 (the phase was not
        # measured), so any ranking of parameters would be noise from ties
        return (
            f"Parameter importances{' for ' + target_name if target_name else ''}: not computed (its value is the "
            f"same in all {len(done)} complete trials: the trials did not measure it)."
        )
    names = list(params) if params is not None else sorted({k for t in done for k in t.params})
    varied = [n for n in names if len({repr(t.params[n]) for t in done if n in t.params}) >= 2]
    if not varied:
        return skip.format(f"no parameter took 2 or more values over the {len(done)} complete trials")
    # Optuna's default evaluator since Optuna 4 (fANOVA would need scikit-learn).
    evaluator = optuna.importance.PedAnovaImportanceEvaluator()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            imp = optuna.importance.get_param_importances(study, evaluator=evaluator, params=varied, target=target)
    except (ValueError, RuntimeError) as e:  # e.g. no parameter common to the complete trials
        return skip.format(str(e).splitlines()[0])
    if not imp:
        return skip.format("no parameter shared by the complete trials")
    rows = [[name, f"{val:.3f}", "█" * max(0, round(val * 20))] for name, val in imp.items()]
    notes = sorted(
        {
            str(w.message).splitlines()[0]
            for w in caught
            if not issubclass(w.category, optuna.exceptions.ExperimentalWarning)
            and "achieve low `target` values" not in str(w.message)
        }
    )  # handled by the sign above
    return "\n".join(
        [
            f"Parameter importances{' for ' + target_name if target_name else ''} (Optuna PED-ANOVA over {len(done)} "
            "complete trials; normalized to sum to 1; how much each parameter matters for reaching the best trials):",
            "",
            log.table(["parameter", "importance", ""], rows),
        ]
        + ([""] + [f"Optuna warned: {n}" for n in notes] if notes else [])
    )
