"""``tuner validate --soak N``: the long-run stability test (:mod:`tuner.measure.soak`) on stored results, each
built as ``tuner validate`` re-renders it and soaked with its runtime env and llama-bench arguments; results for a
device this machine lacks are skipped with a note, as ``--bench`` does.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import tuner.builder.cmake
import tuner.source
from tuner.errors import UsageError
from tuner.measure.soak import SoakResult, plan_chunks, run_soak
from tuner.paths import tuner_home
from tuner.result.checks import load_toml_in
from tuner.result.validate import find_results, render_result, schema_errors
from tuner.targets import archs


def _soak_one(folder: Path, cfg: dict[str, Any], n_tokens: int, model: Path) -> SoakResult:
    choice, arch = cfg["choice"], cfg["target"]["arch"]
    build = tuner.builder.cmake.build_variant(
        render_result(tuner.source.fetch_source(cfg["source"]["spec"]), cfg), targets=("llama-bench",)
    )
    # run.env's llama-bench line: results are measured and exported with FlashAttention on.
    args = ["-fa", "1", *[str(a) for a in choice.get("bench_args", [])]]
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    log_dir = tuner_home() / "runs" / f"soak-{arch}-{folder.name}-{stamp}"
    return run_soak(build.bin_dir, model, n_tokens, dict(choice["runtime_env"]), args, log_dir)


def _find_model(cfg: dict[str, Any], folder: Path) -> Path | None:
    """The result's model file (``[model] file``, a bare file name) in the result folder, ``$TUNER_HOME/models``
    or the current directory."""
    name = str(cfg.get("model", {}).get("file", ""))
    if not name or Path(name).name != name:
        return None
    return next((d / name for d in (folder, tuner_home() / "models", Path.cwd()) if (d / name).is_file()), None)


def soak_results(
    paths: Iterable[Path], n_tokens: int, *, model: Path | None = None, echo: Callable[[str], None] = print
) -> int:
    """Soak every result under ``paths`` that this machine can run; returns how many failed. UsageError, before
    anything runs: ``n_tokens`` <= 0, a ``--model`` that does not exist, a config.toml that fails its schema, or a
    result whose model is not here."""
    plan_chunks(n_tokens)
    if model is not None and not Path(model).is_file():
        raise UsageError(
            f"--model {model} does not exist. Pass the GGUF the result was measured with "
            "(`tuner model synth --like tiny -o tiny.gguf` makes the CPU result's tiny model)."
        )
    local, todo = None, []
    for folder in find_results(paths):
        cfg = load_toml_in(folder, "config.toml")
        if errs := schema_errors(cfg):  # a folder someone else wrote: nothing of it is read before this check
            raise UsageError(
                f"{folder}/config.toml is not a result tuner can soak ({'; '.join(errs[:3])}); "
                f"`tuner validate {folder}` lists what is wrong with it."
            )
        arch = cfg["target"]["arch"]
        if arch != "cpu":
            local = archs.detect_local_archs() if local is None else local
            if arch not in local:
                echo(f"skip {folder}: soak needs a {arch} device, this machine has {local or 'none'}")
                continue
        m = Path(model) if model is not None else _find_model(cfg, folder)
        if m is None:
            raise UsageError(
                f"{folder} was measured with {cfg.get('model', {}).get('file', 'an unnamed model')}, which is "
                "not in the result folder, $TUNER_HOME/models or the current directory, so it cannot be "
                "soaked here. Pass --model PATH (for a CPU result, `tuner model synth --like tiny -o "
                "tiny.gguf` makes the tiny model)."
            )
        todo.append((folder, cfg, m))
    failed = 0
    for folder, cfg, m in todo:
        res = _soak_one(folder, cfg, n_tokens, m)
        echo(f"{'ok ' if res.passed else 'FAIL'} soak {folder}: {res.summary}")
        echo(f"     log: {res.log_file}")
        failed += not res.passed
    return failed
