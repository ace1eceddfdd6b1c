"""``tuner validate --gpu``: on a GPU of the result's arch, ``upstream.patch`` (1) builds on the pristine tree
with the result's defines, (2) passes ``test-backend-ops -o FLASH_ATTN_EXT``, and (3) launches, at the depths
that decide each rule, the decode kernel the tuned build selects there (its ``GGML_TUNER_FA_LOG=1`` line, or
else the kernel ``config.toml``'s points record). The patched build has no hook, so Nsight Compute reads its
launches: the last ``n_gen x n_layers`` FlashAttention launches of ``llama-bench -p 0 -n n_gen -d D``.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tuner import _run
from tuner.builder import cmake
from tuner.errors import TunerError, UsageError
from tuner.measure import gate
from tuner.measure.gate import params_for_model
from tuner.measure.kernel_bench import kernel_at, parse_fa_log
from tuner.plan.fa_rules import FaRule, Phase, rules_env, rules_from_texts
from tuner.plan.variant import Build, RenderedVariant
from tuner.result.checks import Finding, git_apply_to_copy
from tuner.source.spec import Source
from tuner.targets import archs
from tuner.targets.archs import load_arch

# FlashAttention kernel functions of the mma-era tree (fattn-vec.cuh, fattn-tile.cuh, fattn-mma-f16.cuh).
KERNEL_FUNCTIONS = {"flash_attn_ext_vec": "VEC", "flash_attn_tile": "TILE", "flash_attn_ext_f16": "MMA"}
_NCU_FILTER = "regex:^(" + "|".join(KERNEL_FUNCTIONS) + ")$"
_FILL_UBATCH = 2048  # the depth fill in few, large batches: fewer launches for ncu to intercept
_N_GEN = 4


def gpu_skip(arch: str, local: Sequence[str]) -> list[Finding]:
    """The finding of a GPU check skipped because this machine has no ``arch`` GPU (``local``: the ones it has)."""
    why = f"skipped: needs a {arch} GPU, this machine has {', '.join(local) or 'none'}"
    return [Finding(check="upstream.patch on the GPU", ok=True, detail=why)]


def find_ncu() -> Path | None:
    """Nsight Compute's command line: on PATH, in the CUDA toolkit, or a standalone install."""
    if found := shutil.which("ncu"):
        return Path(found)
    cands = [
        Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin/ncu",
        *sorted(Path("/opt/nvidia").glob("nsight-compute/*/ncu")),
    ]
    return next((c for c in cands if c.is_file() and os.access(c, os.X_OK)), None)


def patched_tree_text(patch_file: Path, root: Path) -> dict[str, str]:
    """Relative path -> new text of every file ``patch_file`` changes, applied to copies from ``root``."""
    res, new = git_apply_to_copy(patch_file, root, check=False)
    if res.returncode != 0:
        raise TunerError(f"{patch_file} does not apply to {root}: {res.output.strip()[-400:]}")
    return new


def decision_depths(rules: Sequence[FaRule], points: Sequence[Mapping[str, Any]]) -> list[int]:
    """Recorded decode depths that decide the decode rules: the lowest inside each, the highest below it."""
    depths = sorted({int(p["depth"]) for p in points if p.get("phase") == Phase.DECODE.bench})
    out: set[int] = set()
    for r in rules:
        if r.phase is not Phase.DECODE:
            continue
        inside = [d for d in depths if r.covers(d)]
        below = [d for d in depths if d < r.lo]
        out.update(inside[:1] + below[-1:])
    return sorted(out)


def parse_ncu_csv(text: str) -> list[str]:
    """Kernel function names of an ``ncu --csv --page raw`` report, in launch order."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        return []
    rows = list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))
    named = []
    for row in rows:
        name = (row.get("Kernel Name") or "").strip()
        if not name or not (row.get("ID") or "").strip().isdigit():
            continue  # the units row under the header
        named.append((int(row["ID"]), name.split("<", 1)[0].split("(", 1)[0].strip()))
    return [n for _, n in sorted(named)]


def decode_family(names: Sequence[str], n_layers: int, n_gen: int = _N_GEN) -> tuple[str | None, str]:
    """The kernel family of the last ``n_gen x n_layers`` launches (the decode steps), or None with why."""
    want = n_gen * n_layers
    if len(names) < want:
        return None, f"{len(names)} FlashAttention launches seen, fewer than the {want} decode steps expected"
    fams = {KERNEL_FUNCTIONS.get(n, n) for n in names[-want:]}
    if len(fams) != 1:
        return None, f"the decode launches mix {sorted(fams)}"
    return fams.pop(), ""


def _probe(bin_dir: Path, model: Path, depth: int) -> list[str | Path]:
    """The llama-bench run both sides are read from: ``n_gen`` decode steps after one fill to ``depth``."""
    fill = str(_FILL_UBATCH)
    args = ["-fa", "1", "-p", "0", "-n", str(_N_GEN), "-d", str(depth), "-r", "1", "--no-warmup"]
    return [bin_dir / "llama-bench", "-m", model, *args, "-b", fill, "-ub", fill]


def _ncu_decode_kernel(
    ncu: Path, bin_dir: Path, model: Path, depth: int, n_layers: int, log: Path
) -> tuple[str | None, str]:
    opts = ["--clock-control", "none", "--cache-control", "none", "--kernel-name", _NCU_FILTER]
    opts += ["--metrics", "gpu__time_duration.sum", "--csv", "--page", "raw", "--print-kernel-base", "function"]
    cmd = [ncu, *opts, *_probe(bin_dir, model, depth), "-o", "csv"]
    # Graph replay is not what is checked, and one launch per kernel keeps the count exact.
    env = {**os.environ, "GGML_CUDA_DISABLE_GRAPHS": "1"}
    res = _run.run(cmd, env=env, check=False, timeout=900, what="ncu llama-bench")
    log.write_text(res.output)
    if res.returncode != 0:
        return None, f"ncu exited {res.returncode}; see {log}"
    return decode_family(parse_ncu_csv(res.output), n_layers)


def _tuned_decode_kernel(
    bin_dir: Path, model: Path, depth: int, rules: Sequence[FaRule], fa_env: Mapping[str, str], log: Path
) -> tuple[str | None, str]:
    env = {**os.environ, **fa_env, "GGML_TUNER_FA_LOG": "1", "GGML_CUDA_DISABLE_GRAPHS": "1"}
    if rules:
        env["GGML_TUNER_FA_RULES"] = rules_env(rules)
    res = _run.run(_probe(bin_dir, model, depth), env=env, check=False, timeout=900, what="llama-bench (tuned)")
    log.write_text(res.output)
    kernel, _why = kernel_at(parse_fa_log(res.output), "tg", depth, _N_GEN)
    return kernel, "" if kernel else f"no tuner-fa line for decode at d{depth}; see {log}"


def _build_upstream(folder: Path, cfg: Mapping[str, Any], source: Source) -> Build:
    """The pristine tree with ``upstream.patch``, built with the result's defines (no tuner hook)."""
    files = patched_tree_text(folder / "upstream.patch", source.root)
    rv = RenderedVariant(
        arch=cfg["target"]["arch"],
        variant=f"{cfg['choice']['variant']}+upstream.patch",
        era=source.era,
        source_id=source.source_id,
        source_root=source.root,
        defines=dict(cfg["defines"]),
        patch=(folder / "upstream.patch").read_text(),
        files=files,
    )
    return cmake.build_variant(rv, targets=("llama-bench", "test-backend-ops"))


def model_for(cfg: Mapping[str, Any], models: Sequence[Path]) -> Path | None:
    name = Path(str(cfg["model"].get("file", ""))).name
    same = [m for m in models if m.name == name]
    return same[0] if same else (models[0] if len(models) == 1 else None)


def upstream_gpu_findings(
    folder: Path,
    cfg: Mapping[str, Any],
    source: Source,
    *,
    models: Sequence[Path] = (),
    upstream_bin: Path | None = None,
    tuned_bin: Path | None = None,
    log_dir: Path | None = None,
) -> list[Finding]:
    """The three GPU checks of ``upstream.patch`` as validate findings (skips say why)."""
    arch = load_arch(cfg["target"]["arch"])
    if not (folder / "upstream.patch").is_file():
        return [Finding(check="upstream.patch on the GPU", ok=True, detail="skipped: the result has no upstream.patch")]
    local = archs.detect_local_archs()
    if arch.name not in local:
        return gpu_skip(arch.name, local)
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="tuner-validate-gpu-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    how = "given"
    if upstream_bin is None:
        try:
            b = _build_upstream(folder, cfg, source)
        except TunerError as err:
            return [Finding(check="upstream.patch builds", ok=False, detail=str(err)[:1500])]
        upstream_bin, how = b.bin_dir, "cached" if b.cached else f"built in {b.seconds:.0f} s"
    out = [Finding(check="upstream.patch builds", ok=True, detail=f"{how}: {upstream_bin}")]

    # The cases of the result's head size (as the search's gate): the patch changes only their selection,
    # and all FLASH_ATTN_EXT cases against the CPU reference take many minutes.
    head = int(cfg["model"].get("shape", {}).get("head_dim", 0)) or None
    chk = gate.run_check(
        upstream_bin,
        ops=("FLASH_ATTN_EXT",),
        backend=f"{arch.backend}0",
        log_dir=log_dir,
        params=params_for_model(head, "f16") if head else None,
        label="upstream-test-backend-ops",
    )
    check = "upstream.patch test-backend-ops FLASH_ATTN_EXT"
    out.append(Finding(check=check, ok=chk.passed, detail=f"{chk.summary} (log {chk.log_file})"))

    rules = rules_from_texts(cfg["choice"]["fa_rules"])
    depths = decision_depths(rules, cfg.get("points", []))
    model = model_for(cfg, models)
    ncu = find_ncu()
    why_not = (
        "no decode rule to check"
        if not depths
        else f"no model: pass --model (the result was measured on {cfg['model'].get('file')})"
        if model is None
        else "Nsight Compute (ncu) not found: it reads the patched build's kernels"
        if ncu is None
        else ""
    )
    if why_not:
        # Nothing to check passes; a check that was asked for and could not run does not.
        out.append(
            Finding(check="upstream.patch selects the tuned kernels", ok=not depths, detail=f"not checked: {why_not}")
        )
        return out
    assert model is not None and ncu is not None
    recorded = {int(p["depth"]): str(p.get("kernel")) for p in cfg.get("points", []) if p.get("phase") == "tg"}
    n_layers = int(cfg["model"].get("shape", {}).get("n_layers", 0))
    rows, ok = [], True
    for d in depths:
        if tuned_bin is not None:
            want, why = _tuned_decode_kernel(
                tuned_bin, model, d, rules, dict(cfg["choice"].get("fa_env", {})), log_dir / f"tuned-d{d}.log"
            )
        else:
            want, why = recorded.get(d), "recorded in config.toml"
        got, why_got = _ncu_decode_kernel(ncu, upstream_bin, model, d, n_layers, log_dir / f"ncu-d{d}.log")
        same = want is not None and want == got
        ok &= same
        rows.append(
            f"d{d}: tuned {want or '?'}{' (' + why + ')' if want is None else ''}, "
            f"upstream.patch {got or '?'}{' (' + why_got + ')' if got is None else ''}"
        )
    out.append(Finding(check="upstream.patch selects the tuned kernels", ok=ok, detail="; ".join(rows)))
    return out


def check_gpu_args(models: Sequence[Path], upstream_bin: Path | None, tuned_bin: Path | None) -> None:
    """Bad input for ``--gpu``: one clear paragraph (exit 2) before anything is built or run."""
    for m in models:
        if not Path(m).is_file():
            raise UsageError(
                f"--model {m} does not exist or is not a file. Pass the GGUF the result was measured on "
                "(config.toml's [model] file), or a model of the same shape."
            )
    for opt, d in (("--upstream-bin", upstream_bin), ("--tuned-bin", tuned_bin)):
        if d is not None and not (Path(d) / "llama-bench").is_file():
            raise UsageError(
                f"{opt} {d} has no llama-bench. Point it at a build's bin directory "
                "(for --upstream-bin: the pristine tree with upstream.patch applied)."
            )
