"""``tuner bench``, ``tuner compare``, ``tuner report`` and ``tuner check``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from tuner import log
from tuner.cli._params import (
    CPU_MASK_HELP,
    DIR,
    EXISTING_DIR,
    EXISTING_FILE,
    FILE,
    build_option,
    cpu_mask_option,
    depths_option,
    number_option,
    output_option,
    stamped_run_dir,
)
from tuner.errors import TunerError, UsageError
from tuner.measure.exe import find_bin_dir
from tuner.pairs import parse_pairs

if TYPE_CHECKING:
    import pandas as pd

    from tuner.plan.seed_builds import SeedRun


def _seed_runs(
    names: tuple[str, ...], n_builds: int, arch: str | None, era: str | None, model: Path, extra: tuple[str, ...]
) -> list[SeedRun]:
    """One SeedRun per --build, or none without --seed-build; ``extra`` may not set a flag a seed build sets."""
    if not names:
        return []
    from tuner.measure.bench import check_passthrough_args
    from tuner.plan import seed_builds, space
    from tuner.targets.models import read_shape

    if len(names) != n_builds:
        raise UsageError(
            f"Got {len(names)} --seed-build for {n_builds} --build; give one per build (the same "
            "build directory may repeat, e.g. `cuda` for cuda_dense and cuda_hybrid)."
        )
    if arch is None:
        raise UsageError(
            "--seed-build needs --arch (sm_90, sm_89...): its -ngl/-nkvo values are checked against "
            "that arch's search space."
        )
    sp = space.load_space(arch, era or "mma")
    shape = read_shape(model)
    runs = [seed_builds.seed_run(seed_builds.seed_build(n), sp, shape=shape) for n in names]
    for r in runs:
        check_passthrough_args(
            extra,
            set(r.bench_args[::2]),
            sets=f"--seed-build {r.build.name}",
            instead="drop it from the arguments after --",
        )
    return runs


@click.command(context_settings={"ignore_unknown_options": True})
@click.option(
    "--build",
    "builds",
    multiple=True,
    required=True,
    type=EXISTING_DIR,
    help="Build (or bin) directory; repeat to interleave variants with the first as baseline anchor.",
)
@click.option("--label", "labels", multiple=True, help="Variant name per --build (default: directory name).")
@click.option("--model", required=True, type=EXISTING_FILE, help="GGUF model.")
@click.option("--depths", default="0,4096,16384,32768", show_default=True, callback=depths_option, help="KV depths.")
@number_option("--pp", click.IntRange(0, 1 << 20), "Prompt tokens (0: skip pp).", default=512)
@number_option("--tg", click.IntRange(0, 1 << 20), "Generated tokens (0: skip tg).", default=128)
@click.option("--reps", type=click.IntRange(1, 10000), help="Kept repetitions per test (default 5).")
@click.option(
    "--target-ci", type=click.FloatRange(0.01, 99.99), help="Repeat until the median's CI half-width is within PCT %."
)
@number_option("--max-reps", click.IntRange(1, 10000), default=20)
@click.option("--env", "envs", multiple=True, help="NAME=VALUE for llama-bench (repeatable).")
@click.option("--era", type=click.Choice(["mma", "rocwmma"]), help="-fa spelling (default: detect).")
@click.option("--no-fa", is_flag=True, help="Run with -fa off.")
@click.option("--arch", help="Arch for the roofline columns (see `tuner archs`).")
@click.option("--bandwidth", type=click.FloatRange(0.001, 1e6), help="Memory bandwidth GB/s for the roofline.")
@number_option("--timeout", click.FloatRange(1), "Seconds per llama-bench call.", default=900.0)
@click.option("--cpu-mask", callback=cpu_mask_option, help=CPU_MASK_HELP)
@click.option(
    "--seed-build",
    "seed_builds",
    multiple=True,
    metavar="NAME",
    help="One of the six reference builds per --build (cuda_mmq_moe, cpu_hybrid...): adds its -ngl/-nkvo; needs --arch. "
    "Build each with `tuner build --variant` as docs/seed004-builds.md maps it.",
)
@output_option("out_dir", type=DIR, help="Run directory (default $TUNER_HOME/runs/bench-<time>).", in_place=True)
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
def bench(
    builds: tuple[Path, ...],
    labels: tuple[str, ...],
    model: Path,
    depths: tuple[int, ...],
    pp: int,
    tg: int,
    reps: int | None,
    target_ci: float | None,
    max_reps: int,
    envs: tuple[str, ...],
    era: str | None,
    no_fa: bool,
    arch: str | None,
    bandwidth: float | None,
    timeout: float,
    cpu_mask: tuple[int, ...] | None,
    seed_builds: tuple[str, ...],
    out_dir: Path | None,
    extra: tuple[str, ...],
) -> None:
    """Benchmark builds with llama-bench: pp and tg at every depth, with noise control.

    Extra llama-bench flags go after `--`, e.g. `tuner bench --build B --model M -- -ngl 99`.
    Results go to OUT/<label>.jsonl (and .parquet); logs to OUT/logs.
    """
    from tuner.measure.bench import run_bench
    from tuner.measure.frames import render_table, save_results
    from tuner.measure.interleave import BenchTarget, run_interleaved

    if labels and len(labels) != len(builds):
        raise UsageError(f"Got {len(labels)} --label for {len(builds)} --build; give one per build or none.")
    bins = [find_bin_dir(b) for b in builds]
    runs = _seed_runs(seed_builds, len(builds), arch, era, model, extra)
    names = (
        list(labels)
        or [r.build.name for r in runs]
        or [b.resolve().name if b.resolve().name not in ("bin",) else b.resolve().parent.name for b in builds]
    )
    if len(set(names)) != len(names):
        names = [f"{n}-{i}" for i, n in enumerate(names)]
    out = out_dir or stamped_run_dir("bench")
    kw: dict[str, Any] = dict(
        depths=depths,
        pp=pp,
        tg=tg,
        reps=reps,
        target_ci=target_ci,
        max_reps=max_reps,
        timeout=timeout,
        era=era,
        flash_attn=not no_fa,
        arch=arch,
        bandwidth=bandwidth,
        cpus=cpu_mask,
    )
    env = parse_pairs(envs, "--env", "GGML_CUDA_DISABLE_GRAPHS=1")
    envs_of = [{**r.env, **env} for r in runs] or [env] * len(bins)
    extra_of = [(*r.bench_args, *extra) for r in runs] or [tuple(extra)] * len(bins)
    frames = {}
    with log.step(f"Benchmarking {', '.join(names)} on {model.name} (depths {','.join(map(str, depths))})"):
        if len(bins) == 1:
            frames[names[0]] = run_bench(
                bins[0], model, env=envs_of[0], extra_args=extra_of[0], log_dir=out / "logs", label=names[0], **kw
            )
        else:
            targets = [
                BenchTarget(label=n, bin_dir=b, env=e, extra_args=x)
                for n, b, e, x in zip(names, bins, envs_of, extra_of)
            ]
            res = run_interleaved(targets[1:], targets[0], model, log_dir=out / "logs", **kw)
            frames = {t.label: res.frames[t.label] for t in targets}
            save_results(res.anchors, out / "anchors")
            save_results(res.drift, out / "drift")
    written = [p for name, df in frames.items() for p in save_results(df, out / name)]
    import pandas as pd

    click.echo(render_table(pd.concat(frames.values(), ignore_index=True)))
    if len(frames) > 1:  # each build against the first, by compare's table and verdict rule
        from tuner.result.report import compare_points, noise_line
        from tuner.result.tables import compare_table

        first, pts_all = names[0], []
        for name in list(frames)[1:]:
            pts = compare_points(frames[first], frames[name])
            pts_all += pts
            click.echo("\n" + compare_table(pts, name_a=first, name_b=name))
        log.info("noise reference: " + noise_line(pts_all))
    log.info("results: " + ", ".join(str(p) for p in written))


_AA_HELP = (
    "Two runs of one build on this machine (the A build twice, same settings): their difference per point is "
    "the noise a change must clear. Without it the recorded run-to-run floor of the backend and phase is used "
    "(docs/noise-floors.md)."
)


def _load_aa(aa: tuple[Path, Path] | None) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    from tuner.measure.frames import load_results

    if not aa:
        return None
    a1, a2 = aa
    if a1.resolve() == a2.resolve() or a1.read_bytes() == a2.read_bytes():
        same = "is one file given twice" if a1.resolve() == a2.resolve() else "are two copies of one run"
        raise UsageError(
            f"--aa {a1} {a2} {same}: an A/A pair needs two runs of build A (run its llama-bench again with the "
            "same settings and pass both files), since their difference is the noise a change must clear; one "
            "run against itself has none."
        )
    return load_results(a1), load_results(a2)


def _label(df: pd.DataFrame, path: Path) -> str:
    return str(df["label"].iloc[0]) if len(df) and "label" in df.columns else path.stem


@click.command()
@click.argument("a", type=EXISTING_FILE)
@click.argument("b", type=EXISTING_FILE)
@number_option("--confidence", click.FloatRange(0.5, 0.999), default=0.95)
@number_option(
    "--min-effect", click.FloatRange(0, 100), "A change must also exceed this many percent to count.", default=0.0
)
@click.option("--aa", "aa_files", type=EXISTING_FILE, nargs=2, default=None, metavar="A1 A2", help=_AA_HELP)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["md", "csv", "json"]),
    default="md",
    show_default=True,
    help="md: compare-llama-bench.py-shaped table; csv/json: the same rows as records.",
)
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
@click.option("--plot", "plot_path", type=FILE, help="Also write the speedup-vs-depth plot (PNG) here.")
def compare(
    a: Path,
    b: Path,
    confidence: float,
    min_effect: float,
    aa_files: tuple[Path, Path] | None,
    fmt: str,
    as_json: bool,
    plot_path: Path | None,
) -> None:
    """Compare bench results B against A per test: t/s, speedup, its CI, the noise and a verdict.

    A and B are files `tuner bench` wrote or llama-bench's own output (-o jsonl, json, csv or sql).
    The table has the shape of llama.cpp's scripts/compare-llama-bench.py (tests named
    pp512@d4096, `Model | Test | t/s A | t/s B | Speedup`, its mean t/s) plus tuner's median ratio, its
    CI, the noise reference and the verdict. Faster/slower needs the whole CI beyond the noise: an A/A
    pair (--aa) or the recorded run-to-run floor. The table goes to stdout, notes to stderr.
    """
    from tuner.measure.frames import load_results
    from tuner.result.plots import plot_speedup
    from tuner.result.report import aa_warning, compare_points, noise_line
    from tuner.result.tables import format_compare

    da, db = load_results(a), load_results(b)
    points = compare_points(da, db, aa=_load_aa(aa_files), confidence=confidence, min_effect_pct=min_effect)
    la, lb = _label(da, a), _label(db, b)
    if la == lb:
        la, lb = a.stem, b.stem
    if warn := aa_warning(da, db):
        log.warning(warn)
    log.info("noise reference: " + noise_line(points))
    if fmt == "md" and not as_json:
        from tuner.result.tables import ESTIMATORS

        log.info(ESTIMATORS)
    text = format_compare(points, "json" if as_json else fmt, name_a=la, name_b=lb)
    click.echo(text.rstrip("\n"))
    if plot_path is not None:
        model = next((str(p["model"]) for p in points if p.get("model")), "")
        title = f"{lb} vs {la}" + (f" ({model})" if model else "")
        png = plot_speedup(points, plot_path, name_a=la, name_b=lb, title=title)
        log.info(f"wrote {png}")


@click.command()
@click.argument("files", nargs=-1, required=True, type=EXISTING_FILE)
@click.option("--baseline", help="Baseline variant label (default: the first file's).")
@click.option("--aa", "aa_files", type=EXISTING_FILE, nargs=2, default=None, metavar="A1 A2", help=_AA_HELP)
@output_option("out_dir", type=DIR, help="Write report.md and depth.png here.")
@number_option("--confidence", click.FloatRange(0.5, 0.999), default=0.95)
@click.option("--json", "as_json", is_flag=True, help="Print the tables' rows as JSON records instead of Markdown.")
def report(
    files: tuple[Path, ...],
    baseline: str | None,
    aa_files: tuple[Path, Path] | None,
    out_dir: Path | None,
    confidence: float,
    as_json: bool,
) -> None:
    """Markdown report: every variant against the baseline in compare's table and verdict rule, and a depth plot.

    FILES are files `tuner bench` wrote or llama-bench's own output (-o jsonl, json, csv or sql).
    """
    from tuner.measure.frames import load_results
    from tuner.result.plots import plot_depth
    from tuner.result.report import aa_warning, render_report, report_records

    frames = {}
    for p in files:
        df = load_results(p)
        for label, grp in df.groupby("label", sort=False):
            name = str(label)
            if name in frames:
                name = f"{name}@{p.stem}"
            frames[name] = grp.reset_index(drop=True)
    base = baseline or next(iter(frames))
    aa = _load_aa(aa_files)
    for k in frames:
        if k != base and (warn := aa_warning(frames.get(base, frames[k]), frames[k])):
            log.warning(f"{k} vs {base}: {warn}")
    if as_json:
        import json

        click.echo(json.dumps(report_records(frames, base, aa=aa, confidence=confidence), indent=1, ensure_ascii=False))
    else:
        click.echo(render_report(frames, base, aa=aa, confidence=confidence))
    if out_dir is not None:
        text = render_report(frames, base, aa=aa, confidence=confidence)
        from tuner.paths import write_into

        out_dir.mkdir(parents=True, exist_ok=True)
        write_into(out_dir, "report.md", text)  # replaces a link there, never writes through it
        png = plot_depth(frames, out_dir / "depth.png")
        log.info(f"wrote {out_dir / 'report.md'} and {png}")


@click.command()
@build_option("Build (or bin) directory holding test-backend-ops.", required=True)
@click.option("--backend", default="CUDA0", show_default=True, help="Device name: CUDA0, ROCm0, CPU...")
@click.option("--ops", multiple=True, default=("FLASH_ATTN_EXT",), show_default=True, help="Ops to test (repeatable).")
@click.option("--params", help="Regex over case parameters, e.g. 'hsk=64,hsv=64,'.")
@click.option("--head-dim", type=click.IntRange(1, 1024), help="Build --params for this head size.")
@click.option("--kv-type", help="With --head-dim: KV type to select (f16, q8_0...).")
@click.option("--kernels", help="Gate mode: force each of these FA kernels, e.g. VEC,TILE,MMA.")
@click.option("--jobs", "-j", type=click.IntRange(1, 256), help="test-backend-ops -j.")
@number_option("--timeout", click.FloatRange(1), default=3600.0)
@output_option(
    "out_dir",
    type=DIR,
    help="Folder for the test-backend-ops logs (default $TUNER_HOME/runs/check-<time>).",
    in_place=True,
)
def check(
    build_dir: Path,
    backend: str,
    ops: tuple[str, ...],
    params: str | None,
    head_dim: int | None,
    kv_type: str | None,
    kernels: str | None,
    jobs: int | None,
    timeout: float,
    out_dir: Path | None,
) -> None:
    """Correctness check with test-backend-ops (optionally once per forced FA kernel)."""
    from tuner.measure.gate import params_for_model, run_check, run_gate

    bin_dir = find_bin_dir(build_dir, "test-backend-ops")
    if head_dim is not None:
        if params is not None:
            raise UsageError("Give --params or --head-dim/--kv-type, not both.")
        params = params_for_model(head_dim, kv_type)
    elif kv_type is not None:
        raise UsageError("--kv-type needs --head-dim (e.g. --head-dim 64 --kv-type f16).")
    out = out_dir or stamped_run_dir("check")
    if kernels:
        ks = [k.strip() for k in kernels.split(",") if k.strip()]
        res = run_gate(bin_dir, ks, ops=ops, backend=backend, params=params, jobs=jobs, log_dir=out, timeout=timeout)
        for k, r in res.per_kernel.items():
            click.echo(f"{k}: {'PASS' if r.passed else 'FAIL'}  {r.summary}  (log {r.log_file})")
        ok, failing, summary = res.passed, res.failing, res.summary
    else:
        with log.step(f"test-backend-ops {','.join(ops)} on {backend}"):
            r = run_check(bin_dir, ops=ops, backend=backend, params=params, jobs=jobs, log_dir=out, timeout=timeout)
        click.echo(f"{'PASS' if r.passed else 'FAIL'}  {r.summary}  (log {r.log_file})")
        ok, failing, summary = r.passed, r.failing, r.summary
    for name in failing[:50]:
        click.echo(f"  failing: {name}")
    if not ok:
        raise TunerError(
            f"Correctness check failed: {summary}. Inspect the log above; a failing candidate is infeasible."
        )
