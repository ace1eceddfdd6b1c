"""Whether upstream's own llama-bench runs on this host, before any round is spent on it.

On some AMX hosts (virtual machines among them) llama.cpp's AMX kernels die of SIGILL or SIGSEGV (llama.cpp
issue 20824) and only ``--repack 0`` runs the model. One short llama-bench call finds out; where upstream dies
and ``--repack 0`` runs, every config of the study is measured with it, and the export's commands carry it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

from tuner import _run, log
from tuner.errors import TunerError
from tuner.plan.variant import Build
from tuner.search.context import SearchRun
from tuner.targets.host import host_has_amx

_CRASH = (-4, -11)  # SIGILL, SIGSEGV


def _runs(bin_dir: Path, model: Path, args: list[str], env: Mapping[str, str], log_file: Path) -> int:
    """llama-bench's exit status on a 32-token prompt (1 where it could not start or timed out: no signal)."""
    cmd = [str(bin_dir / "llama-bench"), "-m", str(model), "-p", "32", "-n", "0", "-r", "1", *args]
    try:
        res = _run.run(
            cmd, env={**os.environ, **env}, check=False, timeout=300, log_file=log_file, what="llama-bench probe"
        )
        return res.returncode
    except TunerError:
        return 1


def repack_probe(run: SearchRun, build: Build) -> SearchRun:
    """``run`` with ``--repack 0`` in every config's arguments where needed (module doc); decided once per study."""
    if run.cfg.target.arch.name != "cpu" or run.custom is not None or "--repack" in run.base_args or not host_has_amx():
        return run
    if not (Path(build.bin_dir) / "llama-bench").is_file():
        return run  # no llama-bench to probe (a test's fake build): the rounds say what is wrong
    extra = run.st.host_args
    if extra is None:
        logs, bin_dir, env = run.cfg.run_dir / "logs", Path(build.bin_dir), run.base_env  # upstream's runtime
        rc = _runs(bin_dir, run.cfg.model, list(run.base_args), env, logs / "probe-upstream.log")
        extra = []
        if rc in _CRASH:
            fixed = ["--repack", "0"]
            if _runs(bin_dir, run.cfg.model, [*run.base_args, *fixed], env, logs / "probe-repack-0.log") == 0:
                extra = fixed
                log.notice(
                    f"upstream's llama-bench died of {'SIGILL' if rc == -4 else 'SIGSEGV'} on this CPU in llama.cpp's "
                    "AMX kernels (the weights repacked for AMX tiles; log "
                    f"{logs / 'probe-upstream.log'}) and runs with --repack 0: every config of this study, upstream "
                    "included, is measured with --repack 0, and the export's commands carry it."
                )
        run.st.set_host_args(extra)
    if not extra:
        return run
    return dataclasses.replace(run, base_args=(*run.base_args, *extra), host_args=tuple(extra))
