"""Output-equivalence gate: the logits of a whole model, with llama.cpp's own ``llama-perplexity``, against
upstream's config (test-backend-ops, :mod:`tuner.measure.gate`, checks single ops).

1. **Upstream base.** Upstream's build and config score a fixed token text and save every scored
   position's log-probabilities (``--kl-divergence-base UP.kld``).
2. **Determinism.** The candidate does the same twice; the two files must be byte-identical. The file
   holds per position the exact float ``scale`` and ``min_log_prob`` (functions of every logit) plus each
   log-probability quantized to 16 bits of the position's range, so any run-to-run change of a logit above
   ~1/65535 of the range changes bytes; greedy tokens only see argmax flips, and the printed KLD has 6
   decimals, below which a nondeterministic reduction hides. It costs one more run and no second tool.
3. **Against upstream.** ``--kl-divergence-base UP.kld --kl-divergence`` on the candidate; its mean, 99th
   percentile and maximum KLD and "Same top p" are judged against :data:`DEFAULT_THRESHOLDS` (:func:`judge`).

``strict=True`` (scheduling-only candidates: threads, CUDA graph knobs) also requires the candidate's file
to equal upstream's byte for byte (on the CPU backend ``-t 1`` vs ``-t 2`` indeed gives identical files).

**Phases.** Decode kernels act only when a micro-batch holds one token (Q->ne[1]==1), so ``mode="decode"``
runs every call with ``-b 1 -ub 1`` (upstream's base included) and ``mode="prefill"`` with ``-b N -ub N``.
Rules are judged in the mode of their phase against a base of the same mode (the modes differ by float
reordering). A rule covering only deep KV ranges (``decode:32768-=MMA``) does not fire at the gate's short
context; :func:`widened_rules` widens it so the kernel's numerics are checked at the gate's depth.

**Threshold** (:data:`CALIBRATION` has the measured numbers and the command). On the CPU backend with the
``tiny`` random-weight model, every kernel/schedule pair gave mean KLD 0, p99 <= 1e-6, max <= 2e-6 and
"Same top p" 100% (the base file's 16-bit quantization is the floor); KV-cache types, a deliberate change,
gave q8_0 mean 2e-6 (100%), q5_1 9.9e-5 (94.4%), iq4_nl 3.6e-4, q4_0 5.8e-4. The defaults (mean <= 1e-5,
p99 <= 1e-4, same top >= 98%) sit 10x above the floor at the print resolution, admit q8_0-KV-sized
differences and reject q5_1-KV-sized ones. Random-weight models have nearly uniform logits (PPL ~123k of a
128k vocabulary), so a relative error gives a far smaller KLD than on a trained model, and "Same top p" is
the most sensitive measure there. These are the CPU backend's thresholds; on a GPU the search's gate derives
its own from the kernel band it measures (:mod:`tuner.rounds.output_gate`; H100 numbers in docs/equivalence.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tuner import log
from tuner._hash import file_sha256
from tuner.errors import UsageError
from tuner.measure.bench import check_passthrough_args
from tuner.measure.exe import check_env, check_model, find_exe, run_tool
from tuner.plan.fa_rules import FaRule, Phase

MODES = ("prefill", "decode")
"""``prefill``: ``-b N -ub N`` (prefill kernels); ``decode``: ``-b 1 -ub 1`` (decode kernels)."""

PERPLEXITY = "llama-perplexity"

# Flags the gate sets itself; a candidate's args must not override them.
_OWN_FLAGS = frozenset(
    {"-m", "--model", "-f", "--file", "-c", "--ctx-size", "--chunks", "-b", "--batch-size", "-ub", "--ubatch-size"}
    | {"--kl-divergence-base", "--kl-divergence", "-p", "--prompt", "-o", "--output"}
)
_NUM = r"(-?(?:\d+(?:\.\d*)?|nan|-nan|inf)|-?nan)"
_STAT_LINES = {
    "mean_kld": re.compile(rf"^Mean\s+KLD:\s+{_NUM}\s+±\s+{_NUM}", re.M),
    "max_kld": re.compile(rf"^Maximum KLD:\s+{_NUM}", re.M),
    "p99_kld": re.compile(rf"^99\.0%\s+KLD:\s+{_NUM}", re.M),
    "median_kld": re.compile(rf"^Median\s+KLD:\s+{_NUM}", re.M),
    "same_top_pct": re.compile(rf"^Same top p:\s+{_NUM}\s+±\s+{_NUM}\s*%", re.M),
    "ppl_q": re.compile(rf"^Mean PPL\(Q\)\s+:\s+{_NUM}", re.M),
    "ppl_base": re.compile(rf"^Mean PPL\(base\)\s+:\s+{_NUM}", re.M),
}
_FINAL = re.compile(rf"Final estimate: PPL = {_NUM} \+/- {_NUM}")
# The gate text's words, in the order write_gate_text's LCG indexes them.
_WORDS = (
    "the of and to in is was for on that with as by at from his her they are this be an which or had not but were "
    "their one all has have its been more two first new other who after also when into time only some would these "
    "years may over most such where many them those than so people up about out"
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Thresholds:
    """The decision rule's limits (see the module docstring for how they were calibrated)."""

    mean_kld: float = 1e-5
    """Largest mean KL divergence (nats) over the scored tokens."""
    p99_kld: float = 1e-4
    """Largest 99th-percentile KL divergence."""
    same_top_pct: float = 98.0
    """Smallest share (%) of scored tokens whose most likely next token is upstream's."""


DEFAULT_THRESHOLDS = Thresholds()

CALIBRATION: Mapping[str, object] = {
    "machine": "2-core x86-64 (AVX2), CPU backend, llama.cpp 0c1e570 (llama-cpp-python==0.3.36), tuner's `tiny` "
    "random-weight model (tiny-f16-s0-832db069.gguf), c=128, 2 chunks (126 scored tokens)",
    "command": "llama-perplexity -m tiny.gguf -c 128 --chunks 2 --kl-divergence-base UP.kld --kl-divergence [CANDIDATE ARGS]"
    " (UP.kld from the same build without the candidate args); the same pairs through "
    "`tuner equivalence` are in docs/equivalence.md",
    # (mean KLD, 99% KLD, max KLD, same top p %) as llama-perplexity printed them.
    "floor": {
        "upstream vs itself (-t 2)": (0.0, 1e-6, 1e-6, 100.0),
        "threads -t 1": (0.0, 1e-6, 1e-6, 100.0),
        "-fa off": (0.0, 1e-6, 1e-6, 100.0),
        "-fa on": (0.0, 1e-6, 1e-6, 100.0),
        "-ub 32": (0.0, 1e-6, 1e-6, 100.0),
        "-b 1 -ub 1 (decode path)": (0.0, 1e-6, 2e-6, 100.0),
    },
    "deliberate changes": {
        "-ctk q8_0 -ctv q8_0": (2e-6, 4e-6, 4e-6, 100.0),
        "-ctk q5_1 -ctv q5_1": (9.9e-5, 1.45e-4, 1.46e-4, 94.444),
        "-ctk iq4_nl -ctv iq4_nl": (3.57e-4, 5.6e-4, 6.16e-4, 92.857),
        "-ctk q4_0 -ctv q4_0": (5.84e-4, 8.73e-4, 9.07e-4, 83.333),
        "patched ggml-cpu, RMS norm x1.25 (tests/integration/test_equivalence_cpu.py)": (
            6.275e-3,
            7.799e-3,
            7.818e-3,
            48.413,
        ),
    },
}
"""Measured numbers behind :data:`DEFAULT_THRESHOLDS` (CPU backend; on CUDA the gate uses a kernel band)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class KldStats:
    """What ``llama-perplexity --kl-divergence`` printed (NaN where a line was missing)."""

    mean_kld: float
    mean_kld_unc: float
    p99_kld: float
    max_kld: float
    median_kld: float
    same_top_pct: float
    same_top_unc: float
    ppl_q: float
    ppl_base: float

    @property
    def complete(self) -> bool:
        """True when the KL divergence statistics were printed (the run got to its end)."""
        return not any(math.isnan(v) for v in (self.mean_kld, self.p99_kld, self.max_kld, self.same_top_pct))

    def as_dict(self) -> dict[str, float | None]:
        return {k: (None if math.isnan(v) else v) for k, v in dataclasses.asdict(self).items()}


@dataclasses.dataclass(frozen=True, kw_only=True)
class EquivalenceResult:
    """Outcome of :func:`run_equivalence`; ``passed`` False means infeasible: never exported."""

    verdict: str
    """``pass`` or ``fail``."""
    passed: bool
    reasons: tuple[str, ...]
    """Why it failed, one sentence each (empty when it passed)."""
    mode: str
    deterministic: bool | None
    """Two runs of the candidate gave byte-identical files; None when a run failed first."""
    identical_to_upstream: bool | None
    """The candidate's file equals upstream's byte for byte (required with ``strict``)."""
    stats: KldStats | None
    thresholds: Thresholds
    strict: bool
    logs: Mapping[str, Path]
    """Step -> log file: ``upstream``, ``candidate-a``, ``candidate-b``, ``kld``."""
    digests: Mapping[str, str]
    """Step -> sha256 of the log-prob file it wrote."""
    seconds: float
    settings: Mapping[str, object]
    """ctx, chunks, batch sizes, text digest, args/env on both sides (for the study and the report)."""

    @property
    def summary(self) -> str:
        """One line for people."""
        s = self.stats
        nums = (
            f"mean KLD {s.mean_kld:.6f}, 99% KLD {s.p99_kld:.6f}, max {s.max_kld:.6f}, same top p {s.same_top_pct:.3f}%"
            if s is not None and s.complete
            else "no KLD statistics"
        )
        det = {True: "deterministic", False: "NOT deterministic", None: "determinism not checked"}[self.deterministic]
        head = f"{self.verdict.upper()} ({self.mode}): {nums}; {det}"
        return head + (f". {' '.join(self.reasons)}" if self.reasons else "")

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form for study attributes and reports (the fields in order, ``verdict`` first)."""
        return dataclasses.asdict(self) | {
            "reasons": list(self.reasons),
            "stats": self.stats.as_dict() if self.stats else None,
            "logs": {k: str(v) for k, v in self.logs.items()},
            "seconds": round(self.seconds, 3),
        }


def _num(text: str) -> float:
    return float("nan") if "nan" in text else float(text)


def parse_kld_output(text: str) -> KldStats:
    """Parse the console output of ``llama-perplexity --kl-divergence``; fields whose line is missing are NaN,
    so ``complete`` is False for a run that stopped early (a bad base file still exits 0)."""
    got: dict[str, float] = {}
    for key, rx in _STAT_LINES.items():
        if matches := rx.findall(text):  # a line with a ± has two groups: the value and its uncertainty
            nums = matches[-1] if isinstance(matches[-1], tuple) else (matches[-1],)
            got |= zip((key, key.removesuffix("_pct") + "_unc"), map(_num, nums))
    return KldStats(**{f.name: got.get(f.name, math.nan) for f in dataclasses.fields(KldStats)})


def parse_base_output(text: str) -> float | None:
    """The final PPL of a ``--kl-divergence-base`` (plain perplexity) run, or None if it never got there."""
    m = _FINAL.findall(text)
    return _num(m[-1][0]) if m else None


def _tool_error(text: str) -> str:
    for line in text.splitlines():
        s = line.strip()
        if re.match(r"^\d+\.\d+\.\d+\.\d+ E ", s) or s.startswith("error:"):
            return re.sub(r"^\d+\.\d+\.\d+\.\d+ E\s+", "", s)[:300]
        if any(w in s for w in ("need at least", "failed to open", "unable to load", "does not look like")):
            return s[:300]
    return ""


def judge(
    *,
    stats: KldStats | None,
    deterministic: bool | None,
    identical_to_upstream: bool | None = None,
    strict: bool = False,
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
) -> tuple[bool, tuple[str, ...]]:
    """The decision rule: ``(passed, reasons)``; a pure function of the measured numbers. A candidate passes
    only if two runs of it gave identical logits, its KLD statistics were printed and are within the
    thresholds, and (``strict``) its logits equal upstream's byte for byte."""
    t = thresholds
    why: list[str] = []
    if deterministic is False:
        why.append("Not deterministic: two runs of the same config wrote different log-probabilities.")
    if strict and identical_to_upstream is False:
        why.append(
            "Strict (scheduling-only) candidate: its log-probabilities differ from upstream's, "
            "which a change of threads or launch scheduling must never cause."
        )
    if stats is None or not stats.complete:
        why.append("No KL divergence statistics were printed (see the kld log).")
    else:
        if not stats.mean_kld <= t.mean_kld:
            why.append(f"Mean KLD {stats.mean_kld:.6f} > threshold {t.mean_kld:g}.")
        if not stats.p99_kld <= t.p99_kld:
            why.append(f"99% KLD {stats.p99_kld:.6f} > threshold {t.p99_kld:g}.")
        if not stats.same_top_pct >= t.same_top_pct:
            why.append(f"Same top p {stats.same_top_pct:.3f}% < threshold {t.same_top_pct:g}%.")
    return (not why and deterministic is not None), tuple(why)


def write_gate_text(path: Path, n_words: int = 3000) -> Path:
    """Write the gate's fixed prompt text: ``n_words`` common English words drawn by a fixed LCG (meaningless,
    but the same on every machine and run, many distinct tokens, no network; ~1.05 tokens per word)."""
    x, words, out = 12345, _WORDS.split(), []
    for _ in range(n_words):
        x = (1103515245 * x + 12345) % (1 << 31)
        out.append(words[(x >> 16) % len(words)])
    text = " ".join(out) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
    return path


def widened_rules(rules: Sequence[FaRule]) -> dict[Phase, list[FaRule]]:
    """Rules grouped by phase with every interval widened to ``0-`` (module docstring), one rule per (phase,
    keys, kernel)."""
    out: dict[Phase, list[FaRule]] = {p: [] for p in Phase}
    for r in rules:
        w = r.widened()
        if w not in out[r.phase]:
            out[r.phase].append(w)
    return out


def _check_args(args: Sequence[str], side: str) -> list[str]:
    return list(
        check_passthrough_args(
            args,
            _OWN_FLAGS,
            tool=f"{side} llama-perplexity",
            sets="the equivalence gate itself (model, text, context, chunks, batch sizes, KLD files)",
            instead="use the gate's options (--ctx, --chunks, --mode) instead",
        )
    )


@dataclasses.dataclass(frozen=True)
class _Side:
    """One side of the gate, checked: its llama-perplexity, extra arguments and environment."""

    exe: Path
    args: list[str]
    env: dict[str, str]


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Gate:
    """One gate run's shared settings; ``logs`` and ``digests`` fill as its steps run."""

    common: list[str]
    mode: str
    work_dir: Path
    timeout: float
    logs: dict[str, Path] = dataclasses.field(default_factory=dict)
    digests: dict[str, str] = dataclasses.field(default_factory=dict)


def _run_ppl(side: _Side, base: list[str], *, log_file: Path, timeout: float) -> tuple[int, str]:
    """One llama-perplexity call: (exit code, output); a failure or timeout is an exit code != 0, never an
    exception."""
    lines: list[str] = []
    log_file.unlink(missing_ok=True)
    cmd: list[str | Path] = [side.exe, *base, *side.args]
    rc, err = run_tool(cmd, side.env, log_file=log_file, timeout=timeout, on_line=lines.append, what=PERPLEXITY)
    if err:  # timeout, or the binary would not start
        lines.append(f"error: {err}")
    return rc, "\n".join(lines)


def _base_step(side: _Side, g: _Gate, out: Path, *, log_file: Path) -> tuple[str, str]:
    """A base-mode run writing ``out``: (the file's sha256, '') or ('', why it failed)."""
    out.unlink(missing_ok=True)
    rc, text = _run_ppl(side, [*g.common, "--kl-divergence-base", str(out)], log_file=log_file, timeout=g.timeout)
    if rc != 0 or parse_base_output(text) is None or not out.is_file():
        err = _tool_error(text) or "no final perplexity estimate"
        return "", f"llama-perplexity failed (exit {rc}): {err}. Log: {log_file}."
    return file_sha256(out), ""


def _checked_inputs(
    candidate_bin: Path, upstream_bin: Path, model: Path, *, mode: str, ctx: int, chunks: int
) -> tuple[Path, Path, Path]:
    """run_equivalence's binaries and model checked: (cand_exe, up_exe, model); UsageError otherwise."""
    if mode not in MODES:
        raise UsageError(
            f"mode must be one of {', '.join(MODES)} (got {mode!r}): prefill checks prefill kernels "
            "(-b N -ub N), decode checks decode kernels (-b 1 -ub 1)."
        )
    for name, v, lo, hi in (("ctx", ctx, 16, 1 << 20), ("chunks", chunks, 1, 10000)):
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise UsageError(f"{name} must be an integer in [{lo}, {hi}] (got {v!r}).")
    if chunks * (ctx - 1 - ctx // 2) < 100:
        raise UsageError(
            f"ctx={ctx} and chunks={chunks} score {chunks * (ctx - 1 - ctx // 2)} tokens; llama-perplexity prints "
            "no KL divergence statistics under 100 (it scores ctx/2 - 1 tokens per chunk). Raise --chunks "
            f"to {-(-100 // (ctx - 1 - ctx // 2))} or --ctx."
        )
    model = check_model(model)
    return find_exe(Path(candidate_bin), PERPLEXITY), find_exe(Path(upstream_bin), PERPLEXITY), model


def _upstream_base(up: _Side, model: Path, g: _Gate) -> tuple[Path, str]:
    """Upstream's log-prob file, keyed by everything that shapes it and reused across candidates; (file, error)."""
    side = (str(up.exe), up.exe.stat().st_mtime_ns, g.common, list(up.args), sorted(up.env.items()))
    ukey = hashlib.sha256(repr((*side, model.stat().st_size, model.stat().st_mtime_ns)).encode()).hexdigest()[:16]
    up_file = g.work_dir / f"upstream-{g.mode}-{ukey}.kld"
    stamp = g.work_dir / f"upstream-{g.mode}-{ukey}.sha256"
    g.logs["upstream"] = g.work_dir / f"upstream-{g.mode}-{ukey}.log"
    if up_file.is_file() and stamp.is_file():
        g.digests["upstream"] = stamp.read_text().strip()
        return up_file, ""
    with log.step(f"equivalence gate ({g.mode}): upstream's log-probabilities"):
        digest, err = _base_step(up, g, up_file, log_file=g.logs["upstream"])
    if err:
        return up_file, err
    g.digests["upstream"] = digest
    stamp.write_text(digest + "\n")
    return up_file, ""


def run_equivalence(
    candidate_bin: Path,
    upstream_bin: Path,
    model: Path,
    *,
    mode: str = "prefill",
    candidate_env: Mapping[str, str] = {},
    candidate_args: Sequence[str] = (),
    upstream_env: Mapping[str, str] = {},
    upstream_args: Sequence[str] = (),
    work_dir: Path,
    ctx: int = 128,
    chunks: int = 2,
    strict: bool = False,
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
    timeout: float = 1800.0,
    keep_files: bool = False,
) -> EquivalenceResult:
    """Run the gate: upstream's base, the candidate twice (determinism), the candidate's KLD vs upstream.

    ``upstream_bin`` may be the candidate's own directory (env/args candidates); upstream's log-prob file in
    ``work_dir`` is reused by later candidates. ``ctx`` is the context per chunk (half of it scored, at least
    16); ``chunks * (ctx/2 - 1)`` scored tokens must be at least 100 (llama-perplexity prints no statistics
    below that). ``keep_files`` keeps the candidate's log-prob files (``chunks * ctx/2 * n_vocab * 2`` bytes).
    A failed or crashed tool run is a failed gate naming its log, not an exception.

    Raises:
        UsageError: A missing binary or model, a bad mode, context, chunk count or argument.
    """
    cand_exe, up_exe, model = _checked_inputs(candidate_bin, upstream_bin, model, mode=mode, ctx=ctx, chunks=chunks)
    c_args, u_args = _check_args(candidate_args, "candidate"), _check_args(upstream_args, "upstream")
    cand = _Side(cand_exe, c_args, check_env(candidate_env))
    up = _Side(up_exe, u_args, check_env(upstream_env))
    t0 = time.monotonic()
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    text = write_gate_text(work_dir / "gate-text.txt", n_words=max(400, int(ctx * chunks * 1.2) + 64))
    batch = ["-b", "1", "-ub", "1"] if mode == "decode" else ["-b", str(ctx), "-ub", str(ctx)]
    common = ["-m", str(model), "-f", str(text), "-c", str(ctx), "--chunks", str(chunks), *batch]
    settings = {
        "mode": mode,
        "ctx": ctx,
        "chunks": chunks,
        "batch": batch,
        "model": str(model),
        "text_sha256": file_sha256(text)[:16],
        "candidate_bin": str(candidate_bin),
        "upstream_bin": str(upstream_bin),
        "candidate_env": cand.env,
        "candidate_args": c_args,
        "upstream_env": up.env,
        "upstream_args": u_args,
    }
    g = _Gate(common=common, mode=mode, work_dir=work_dir, timeout=timeout)

    def done(
        reasons: Sequence[str], *, det: bool | None = None, ident: bool | None = None, stats: KldStats | None = None
    ) -> EquivalenceResult:
        passed, why = judge(
            stats=stats, deterministic=det, identical_to_upstream=ident, strict=strict, thresholds=thresholds
        )
        reasons = tuple(reasons) + tuple(w for w in why if not reasons or not w.startswith("No KL"))
        passed = passed and not reasons
        for f in ("candidate-a.kld", "candidate-b.kld"):
            if not keep_files:
                (work_dir / f).unlink(missing_ok=True)
        return EquivalenceResult(
            passed=passed,
            verdict="pass" if passed else "fail",
            reasons=reasons,
            mode=mode,
            deterministic=det,
            identical_to_upstream=ident,
            stats=stats,
            thresholds=thresholds,
            strict=strict,
            logs=dict(g.logs),
            digests=dict(g.digests),
            seconds=time.monotonic() - t0,
            settings=settings,
        )

    up_file, err = _upstream_base(up, model, g)
    if err:
        return done([f"Upstream's run failed, so nothing could be compared: {err}"])
    for tag in ("a", "b"):  # the candidate's two base-mode runs
        name = f"candidate-{tag}"
        g.logs[name] = work_dir / f"{name}.log"
        with log.step(f"equivalence gate ({mode}): candidate run {tag.upper()}"):
            digest, err = _base_step(cand, g, work_dir / f"{name}.kld", log_file=g.logs[name])
        if err:
            return done([f"The candidate's run {tag.upper()} failed: {err}"])
        g.digests[name] = digest
    det = g.digests["candidate-a"] == g.digests["candidate-b"]
    ident = g.digests["candidate-a"] == g.digests["upstream"]

    g.logs["kld"] = work_dir / "kld.log"
    with log.step(f"equivalence gate ({mode}): candidate's KL divergence vs upstream"):
        kld = [*common, "--kl-divergence-base", str(up_file), "--kl-divergence"]
        rc, output = _run_ppl(cand, kld, log_file=g.logs["kld"], timeout=timeout)
    stats = parse_kld_output(output)
    reasons = []
    if rc != 0 or not stats.complete:
        err = _tool_error(output) or "no KL divergence statistics"
        reasons.append(f"The candidate's KL divergence run failed (exit {rc}): {err}. Log: {g.logs['kld']}.")
    return done(reasons, det=det, ident=ident, stats=stats)
