"""What every result folder an export writes shares: the folder check and the staged, atomic replacement
(:func:`staged_export`), the chosen config's build files (``tuned.patch`` unless the kernels are upstream's,
``CMakeUserPresets.json``, ``run.env``) and the baked render that ``tuner validate`` checks them against.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner import log
from tuner._hash import text_sha256
from tuner.errors import UsageError
from tuner.paths import current_umask
from tuner.plan import render
from tuner.plan.fa_rules import FaRule, rules_env
from tuner.plan.render import render_presets
from tuner.plan.space import SearchSpace, compile_values_of, runtime_env_and_args
from tuner.plan.variant import RenderedVariant

if TYPE_CHECKING:
    from tuner.source.spec import Source

PRESETS_FILE = "CMakeUserPresets.json"
"""The preset file an export writes: CMake reads it beside the tree's own ``CMakePresets.json`` (which it
must not replace: the tuned preset inherits that file's ``base``/``release``)."""

EXPORT_FILES = frozenset(
    ["config.toml", "tuned.patch", PRESETS_FILE, "run.env", "report.md", "PR.md", "upstream.patch", "speedup.png"]
    + ["pareto_decode.png", "depth.png", "CMakePresets.json"]
)  # the last: what exports wrote before CMakeUserPresets.json
"""Every file an export writes (or wrote): an existing folder holding only these is a previous export."""

NO_PATCH_NOTE = (
    "No tuned.patch: nothing to patch, the tuned kernels are upstream's (the export differs from the "
    "pristine tree only in CMake settings and run-time arguments)."
)


def check_out_dir(out_dir: Path) -> None:
    """UsageError unless ``out_dir`` is missing, empty or a previous export (only files an export writes): an
    export replaces the whole folder. A llama.cpp checkout is named as such (the likely intent)."""
    tree_files = (out_dir / "CMakeLists.txt").is_file() or (out_dir / "CMakePresets.json").is_file()
    if (out_dir / "ggml").is_dir() and tree_files:
        raise UsageError(
            f"{out_dir} is a llama.cpp source tree (it has ggml/ and CMakeLists.txt). `tuner export -o` writes a "
            f"result folder and replaces it whole, so it will not write into a checkout. Export to a folder of its own "
            f"(e.g. results/<arch>/<model>), then copy {PRESETS_FILE} into the tree and `git apply` tuned.patch there "
            f"(when the export has one)."
        )
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(
            f"{out_dir} is a file, not a folder. Pass -o a folder (new, empty or a previous export), or "
            "move the file away."
        )
    if out_dir.is_dir():
        if foreign := sorted(p.name for p in out_dir.iterdir() if p.name not in EXPORT_FILES):
            shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
            raise UsageError(
                f"{out_dir} exists and holds files an export does not write ({shown}). An export replaces its folder "
                f"whole, so it only overwrites an empty folder or a previous export. Choose another -o, or move those "
                f"files away."
            )


_STAGING = re.compile(r"\.(?P<name>.+)\.(?P<kind>tmp|old)-[a-z0-9_]{8}")
"""The names :func:`staged_export` gives its folders beside ``-o`` (``tempfile.mkdtemp``'s 8 characters)."""


def _own(folder: Path) -> int | None:
    """An fd holding an exclusive flock on ``folder`` (released when closed, or when its process dies, even by
    ``kill -9``), or None where another process holds it (a live export) or it is not a plain folder."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def clean_leftovers(out_dir: Path) -> list[Path]:
    """Remove (and return) what killed exports to ``out_dir`` left beside it and no live process holds: staging
    folders (``.NAME.tmp-*``) and moved-aside previous exports (``.NAME.old-*``); one moved aside before its
    replacement was renamed into place is put back as ``out_dir`` (the last whole export)."""
    parent = out_dir.parent
    try:
        entries = sorted(parent.iterdir(), key=lambda p: p.name)
    except OSError:
        return []
    gone = []
    for p in entries:
        m = _STAGING.fullmatch(p.name)
        if m is None or m["name"] != out_dir.name or p.is_symlink() or not p.is_dir():
            continue
        fd = _own(p)
        if fd is None:  # a live export is writing it, or it is not ours to judge
            continue
        try:
            prev = p / "x"
            if m["kind"] == "old" and not os.path.lexists(out_dir) and prev.is_dir() and not prev.is_symlink():
                os.replace(prev, out_dir)
                log.info(f"put back the previous export {out_dir} (an export was killed while replacing it)")
            shutil.rmtree(p)
            gone.append(p)
        finally:
            os.close(fd)
    if gone:
        log.info(f"removed {len(gone)} folder(s) left beside {out_dir} by a killed export")
    return gone


@contextlib.contextmanager
def staged_export(out_dir: Path, *, check: Callable[[Path], None] = check_out_dir) -> Iterator[Path]:
    """Yield a temporary folder beside ``out_dir`` to write the export into; on success it replaces
    ``out_dir`` (the previous export is moved aside, then removed), on any failure it is removed and
    ``out_dir`` is left as it was; ``check`` (UsageError) first. Every command that replaces a result folder
    whole goes through here. The staging folders are flocked while in use, so the next export to the same
    ``-o`` removes those a killed export left (:func:`clean_leftovers`)."""
    check(out_dir)
    parent = out_dir.parent
    parent.mkdir(parents=True, exist_ok=True)
    clean_leftovers(out_dir)
    # Beside the target, so the final rename stays on one filesystem (atomic, no copy).
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=parent))
    held = [fd for fd in [_own(tmp)] if fd is not None]
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes it 0700; an export folder gets the usual mode
        old = None
        if out_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=parent))
            held += [fd for fd in [_own(old)] if fd is not None]
            os.replace(out_dir, old / "x")
        try:
            os.replace(tmp, out_dir)
        except BaseException:
            if old is not None:  # put the previous export back
                os.replace(old / "x", out_dir)
                shutil.rmtree(old, ignore_errors=True)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        for fd in held:
            os.close(fd)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Choice:
    """A chosen config's knob values as an export writes them: the variant, the compile values, and the runtime
    knobs' environment (``run_env``, the hook's ``GGML_TUNER_*`` apart as ``fa_env``) and llama-bench args."""

    variant: str
    compile_values: dict[str, int]
    run_env: dict[str, str]
    fa_env: dict[str, str]
    args: list[str]

    @classmethod
    def of(
        cls, space: SearchSpace, values: Mapping[str, object], *, runtime: Mapping[str, object] | None = None
    ) -> Choice:
        env, args = runtime_env_and_args(space, values if runtime is None else runtime)
        return cls(
            variant=str(values.get("variant") or space.variants[0]),
            compile_values=compile_values_of(space, values),
            run_env={k: v for k, v in env.items() if not k.startswith("GGML_TUNER_")},
            fa_env={k: v for k, v in env.items() if k.startswith("GGML_TUNER_")},
            args=args,
        )


def source_table(source: Source) -> dict[str, str]:
    return {"spec": source.spec, "source_id": source.source_id, "commit": source.commit or "", "era": source.era}


def hashes_table(rv: RenderedVariant) -> dict[str, str]:
    """config.toml's ``[hashes]``: what validate checks the folder's patch and defines against."""
    return {
        "patch_sha256": text_sha256(rv.patch),
        "defines_sha256": text_sha256(json.dumps(dict(rv.defines), sort_keys=True)),
    }


def export_render(
    source: Source, arch: str, variant: str, *, compile_values: Mapping[str, int], baked: Mapping[str, str]
) -> RenderedVariant:
    """The exported (baked) render of a config; its ``patch`` is empty (no ``tuned.patch``) where it equals the
    default config's, whose baked hook selects exactly upstream's kernels."""
    rv = render.render_variant(source, arch, variant, compile_values=compile_values, baked_runtime=baked)
    if rv.patch:
        default = render.render_variant(source, arch, variant, baked_runtime={})
        if default.patch == rv.patch:
            return dataclasses.replace(rv, patch="", files={})
    return rv


def write_build_files(
    out_dir: Path,
    rv: RenderedVariant,
    choice: Choice,
    rules: Sequence[FaRule],
    *,
    model: str,
    depths: str,
    mask: str = "",
) -> None:
    """``tuned.patch`` (only when it changes something), ``CMakeUserPresets.json`` (preset ``tuned-<arch>``) and
    ``run.env``: the runtime environment, the FA rules (when the export has any) and the llama-bench and
    llama-server command lines (under ``taskset -c mask`` when measured pinned)."""
    if rv.patch:
        (out_dir / "tuned.patch").write_text(rv.patch)
    (out_dir / PRESETS_FILE).write_text(render_presets(rv, name=f"tuned-{rv.arch.replace('_', '')}"))
    pin = ["taskset", "-c", mask] if mask else []  # measured pinned (--cpu-mask): the numbers hold only so
    bench_cmd = [*pin, "llama-bench", "-m", model, "-fa", "1", "-d", depths, *choice.args]
    server_cmd = [*pin, "llama-server", "-m", model, "-fa", "on", *server_args(list(choice.args))]
    text = "# Runtime settings chosen by tuner; `set -a; . ./run.env; set +a` before running llama.cpp.\n"
    text += "".join(f"{k}={v}\n" for k, v in sorted(choice.run_env.items()))
    if rules:
        text += "# The FA rules are baked into tuned.patch; on a tuner build (env hook) the same rules are:\n"
        text += f"# GGML_TUNER_FA_RULES={rules_env(rules)}\n"
    text += f"# llama-bench: {' '.join(bench_cmd)}\n# llama-server: {' '.join(server_cmd)}\n"
    (out_dir / "run.env").write_text(text)


def baked_runtime(rules: Sequence[FaRule], fa_env: Mapping[str, str]) -> dict[str, str]:
    """The hook's env values to compile in (render's ``baked_runtime``); export and validate share it."""
    out = dict(fa_env)
    out.pop("GGML_TUNER_FA_RULES", None)
    if rules:
        out["GGML_TUNER_FA_RULES"] = rules_env(rules)
    return out


def portable_paths(x: object, study_name: str) -> object:
    """``x`` with every absolute local path made portable: relative to the study's run folder
    (``…/runs/<study>/``) where it is under it, else the file name. An export is read on other machines;
    this machine's folders mean nothing there (and name its user)."""
    if isinstance(x, Mapping):
        return {k: portable_paths(v, study_name) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [portable_paths(v, study_name) for v in x]
    if isinstance(x, str) and x.startswith("/") and " " not in x and "\n" not in x:
        marker = f"/runs/{study_name}/"
        return x.split(marker, 1)[1] if marker in x else Path(x).name
    return x


def server_args(args: list[str]) -> list[str]:
    # llama-bench and llama-server share -ub/-b/-t/-ngl spellings; the server's -nkvo and --no-repack are switches
    # (bench: -nkvo 0|1, --repack 0|1); anything else is bench-only.
    out = []
    for i in range(0, len(args) - 1, 2):
        if args[i] in ("-ub", "-b", "-t", "-ngl", "-ctk", "-ctv"):
            out += [args[i], args[i + 1]]
        elif args[i] == "-nkvo" and args[i + 1] == "1":
            out.append("-nkvo")
        elif args[i] == "--repack" and args[i + 1] == "0":  # llama-server (common/arg.cpp): --no-repack
            out.append("--no-repack")
    return out


def tomlable(x: object) -> Any:
    """TOML has no null: drop None values, stringify the rest that TOML cannot hold."""
    if isinstance(x, Mapping):
        return {str(k): tomlable(v) for k, v in x.items() if v is not None}
    if isinstance(x, (list, tuple)):
        return [tomlable(v) if v is not None else "none" for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x
