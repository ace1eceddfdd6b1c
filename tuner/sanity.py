"""Nothing with a NaN or infinite number is exported as a result.

:func:`require_finite` walks a result (mappings, sequences, numbers) and raises a
:class:`~tuner.errors.TunerError` naming where a non-finite number sits; the search calls it before
it stores a result and the export before it writes one, so a search whose llama-bench calls all
failed can never end in a report of ``nan`` t/s.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from tuner.errors import TunerError


def nonfinite(obj: object, keys: Iterable[str] = ("base_ts", "tuned_ts"), _path: str = "") -> list[str]:
    """Paths (``rows[3].ts_final``) of NaN/inf numbers under a key of ``keys`` anywhere in ``obj``.

    Only measured throughputs are checked: a CPU% or CI that a record could not observe is NaN by
    design (older studies, no NVML) and says "unknown", not "failed"."""
    keys = tuple(keys)
    out: list[str] = []
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            p = f"{_path}.{k}" if _path else str(k)
            if k in keys and isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isfinite(v):
                out.append(p)
            elif isinstance(v, (Mapping, list, tuple)):
                out += nonfinite(v, keys, p)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out += nonfinite(v, keys, f"{_path}[{i}]")
    return out


def require_finite(result: object, what: str, keys: Iterable[str] = ("base_ts", "tuned_ts")) -> None:
    """TunerError naming ``what`` and the first places when ``result`` holds a non-finite measured throughput
    (see :func:`nonfinite`), so nothing measured as NaN is exported."""
    bad = nonfinite(result, keys)
    if bad:
        raise TunerError(
            f"{what} has no measured value at {', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''} (NaN: llama-bench "
            "gave no result there), so it is not exported. The llama-bench logs in the run dir's logs/ folder say why; "
            "fix that and rerun the same command."
        )
