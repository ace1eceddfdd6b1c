"""Names of the per-head-size MMA instance TUs that the CUDA CMake hook compiles in tune mode.

Each ``fattn-mma-f16-instance-ncols1_<a>-ncols2_<b>.cu`` instantiates every head size of its column
pair (one ``DECL_FATTN_MMA_F16_CASE(DKQ, DV, ncols1, ncols2);`` line each). With ``GGML_TUNER_TU_DIR``
set, the hook in ``templates/patches/common/tu-hook.cmake.j2`` compiles one generated TU per line
instead, ``template-instances/split/<stem>-dkq<DKQ>.cu`` with the header ``<stem>-dkq<DKQ>.h``, so a
candidate that changes one MMA row recompiles one head size. The split files exist only in a build's
source copy after configure; this module names them from the pristine tree the same way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

MMA_GLOB = "ggml/src/ggml-cuda/template-instances/fattn-mma*.cu"
SPLIT_DIR = "ggml/src/ggml-cuda/template-instances/split"
# The hook's string(REGEX MATCHALL) pattern (CMake regexes have no \d); the trailing ';' stays out of
# the match there because CMake lists split on ';'.
DECL_RE = re.compile(r"DECL_FATTN_MMA_F16_CASE\(([0-9]+), *([0-9]+), *([0-9]+), *([0-9]+)\)")
_CUDA_CMAKE = "ggml/src/ggml-cuda/CMakeLists.txt"


def split_tu(whole: str, dkq: int) -> str:
    """Tree-relative path of the split TU of one head size (``.../split/<stem>-dkq64.cu``)."""
    stem = PurePosixPath(whole).name.split(".", 1)[0]
    return f"{SPLIT_DIR}/{stem}-dkq{dkq}.cu"


def _decl_dkqs(path: Path) -> list[int]:
    return [int(m.group(1)) for m in DECL_RE.finditer(path.read_text(errors="replace"))]


def split_tus(source_root: Path) -> dict[str, str]:
    """Every split TU of the tree, sorted: split path -> the whole instance TU it comes from.

    An instance file without any DECL line is not split (the hook leaves it compiled as it is).
    """
    out: dict[str, str] = {}
    for p in sorted(source_root.glob(MMA_GLOB)):
        whole = p.relative_to(source_root).as_posix()
        for dkq in _decl_dkqs(p):
            out[split_tu(whole, dkq)] = whole
    return dict(sorted(out.items()))


def split_tu_of(source_root: Path, whole: str, dkq: int) -> str | None:
    """The split TU of ``whole`` for head size ``dkq``; None when the file has no DECL for it."""
    path = source_root / whole
    if not path.is_file() or dkq not in _decl_dkqs(path):
        return None
    return split_tu(whole, dkq)


def splits_mma(era: str, family: str) -> bool:
    """Whether the hook of this era and variant family splits the MMA instances: only the CUDA
    CMakeLists' hook does (a HIP build compiles ggml-hip/CMakeLists.txt, whose hook keeps whole TUs)."""
    return era == "mma" and family == "cuda"


def has_mma_split(files: Mapping[str, str], *, era: str, family: str) -> bool:
    """Whether a build of this rendered patch compiles the split TUs instead of the whole MMA instances
    (tune mode; a baked patch has no hook)."""
    text = files.get(_CUDA_CMAKE, "")
    return splits_mma(era, family) and "GGML_TUNER_TU_DIR" in text and "template-instances/split/" in text
