"""Extra executables built on demand into a finished build, without touching its build id."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from tuner import _run, log
from tuner.builder import hip
from tuner.builder.cmake import HIP_CMAKE_SPEC, check_target_names, find_build_tools, ninja_log_lines, rebuilt_objects
from tuner.builder.records import hold_artifact, is_on, load_build_record, locked, write_json
from tuner.errors import TunerError, UsageError
from tuner.plan.variant import Build


def ensure_targets(build: Build, targets: Sequence[str], *, jobs: int | None = None) -> Build:
    """Add executable targets (``llama-perplexity``) to a finished build's artifact, keeping its build id.

    Build ids (``stable_hash(artifact_key, toolchain)``) do not depend on the targets, and stored results and study
    databases key on them, so an extra tool is built on demand into the existing build directory (its own translation
    units plus a link) and copied into the artifact's ``bin/`` with the libraries it needs that are not there yet; the
    candidate's own libraries are never replaced. ``build.json`` records each extra target under ``extra_targets``
    (seconds, log, rebuilt objects); ``targets`` and ``build_id`` are unchanged, so :func:`build_variant` still finds
    the artifact cached. Returns the Build with ``meta`` updated (the same object when every target was there).

    Raises UsageError for a compile-only build or a bad target name, TunerError (naming the log and its last
    lines) when a target fails to build.
    """
    if build.compile_only:
        raise UsageError(f"{build.build_dir} is a compile-only check; build the variant first (`tuner build`).")
    check_target_names(targets)
    jobs = jobs or os.cpu_count() or 1
    art = Path(build.bin_dir).parent
    if all((art / "bin" / t).is_file() for t in targets):
        return build
    root = Path(build.build_dir).parent
    with locked(root):
        art = _current(art, build.build_id)
        missing = [t for t in targets if not (art / "bin" / t).is_file()]
        rec = load_build_record(art / "build.json") or dict(build.meta)
        if missing and rec.get("carried"):
            # a carried build has no build directory here to add a target to
            raise UsageError(
                f"The build in {art} was carried from another machine (`tuner build --from-pack`) and has no "
                f"{', '.join(missing)}. On the machine that built it, pack it again with those targets "
                f"(`tuner build ... --targets {','.join([*rec.get('targets', []), *missing])} --pack FILE`), or build "
                "here without --from-pack."
            )
        if missing:
            defines = dict(rec.get("defines", {}))
            if is_on(defines.get("GGML_HIP")):
                tc_hip = hip.require_hip_toolchain()
                tools, env = find_build_tools(str(tc_hip.cmake), HIP_CMAKE_SPEC), tc_hip.env()
            else:
                tools, env = find_build_tools(), None
            log_file = root / "logs" / f"extra-{art.name}.log"
            start = time.monotonic()
            before = ninja_log_lines(build.build_dir)
            with log.step(f"Building {', '.join(missing)} into {art}"):
                _run.run(
                    [tools.cmake.cmake_path, "--build", build.build_dir, "--target", *missing, "--parallel", str(jobs)],
                    env=env,
                    log_file=log_file,
                    what=f"Build of {', '.join(missing)} in {build.build_dir}",
                )
            rebuilt = rebuilt_objects(build.build_dir, before)
            bin_src = Path(build.build_dir) / "bin"
            for t in missing:
                if not (bin_src / t).is_file():
                    msg = f"The build finished but {bin_src / t} does not exist; is {t!r} an executable target?"
                    raise TunerError(msg)
            # New libraries only (the tool's own, e.g. libllama-perplexity-impl.so); the artifact's
            # existing libraries are the candidate's and stay as they are.
            for lib in sorted(bin_src.glob("lib*.so*")):
                dst = art / "bin" / lib.name
                if dst.exists() or dst.is_symlink():
                    continue
                if lib.is_symlink():
                    os.symlink(os.readlink(lib), dst)
                else:
                    shutil.copy2(lib, dst)
            for t in missing:
                tmp = art / "bin" / f".{t}.partial-{os.getpid()}"
                shutil.copy2(bin_src / t, tmp)
                tmp.rename(art / "bin" / t)
            secs, built = round(time.monotonic() - start, 3), time.strftime("%Y-%m-%dT%H:%M:%S%z")
            entry = {"seconds": secs, "log": str(log_file), "rebuilt": rebuilt, "built": built}
            rec["extra_targets"] = {**rec.get("extra_targets", {}), **{t: dict(entry) for t in missing}}
            write_json(art / "build.json", rec)
    return dataclasses.replace(build, bin_dir=art / "bin", meta=dict(rec))


def _current(folder: Path, build_id: str) -> Path:
    """The artifact's current folder where a later build of the same id installed one after ``folder`` (another
    command added a target meanwhile, records.py): the extra target goes there, or the next cached lookup
    would not see it. ``folder`` itself otherwise (an older layout, or another build id)."""
    link = folder.parent / re.sub(r"\.v\d+$", "", folder.name)
    got = hold_artifact(
        link, lambda f: f if (load_build_record(f / "build.json") or {}).get("build_id") == build_id else None
    )
    return got[0] if got is not None else folder
