"""What the checks of a stored result share: one check's outcome (:class:`Finding`) and applying a patch
to pristine copies of the files it touches (:func:`git_apply_to_copy`). Used by :mod:`tuner.result.validate`
(the static checks) and :mod:`tuner.result.upstream_check` (the GPU checks of ``upstream.patch``)."""

from __future__ import annotations

__all__ = ["Finding", "git_apply_to_copy"]

import dataclasses
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tuner import _run


@dataclasses.dataclass(frozen=True, kw_only=True)
class Finding:
    """One check of a result: its name, whether it passed, and why (or why it was skipped)."""

    check: str
    ok: bool
    detail: str = ""


def git_apply_to_copy(patch_file: Path, root: Path, *, check: bool = True) -> tuple[Any, dict[str, str]]:
    """``git apply`` (``--check`` by default) against pristine copies of the files the patch touches.

    Returns the run's result and, when the patch was applied (``check=False``, exit 0), the new text of
    each touched file. Not in the tree itself: a vendored tree may carry a ``.git`` file pointing at a
    submodule that does not exist here, and a tree inside a git work tree makes git apply the paths
    relative to that work tree's root and skip the others ("Skipped patch").
    """
    rels = sorted(set(re.findall(r"^--- a/(\S+)$", patch_file.read_text(), flags=re.M)))
    with tempfile.TemporaryDirectory(prefix="tuner-apply-") as tmp:
        for rel in rels:
            src = root / rel
            if src.is_file():
                (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, Path(tmp) / rel)
        res = _run.run(
            ["git", "apply", *(["--check"] if check else []), "--verbose", str(patch_file.resolve())],
            cwd=Path(tmp),
            check=False,
            what="git apply --check" if check else "git apply",
        )
        new = {} if check or res.returncode != 0 else {rel: (Path(tmp) / rel).read_text() for rel in rels}
        return res, new
