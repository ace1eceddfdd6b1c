"""Where the 1B decode noise of session 4 comes from: repetitions within one llama-bench call vs the
medians of the same candidate's calls in different rounds. Reads the recorded logs only:

    python docs/h100/session4/noise.py   # from the repo root
"""

from __future__ import annotations

import io
import json
import re
import statistics as st
import tarfile
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
within: dict[tuple[str, int], list[float]] = defaultdict(list)
medians: dict[tuple[str, int], list[float]] = defaultdict(list)
with tarfile.open(HERE / "sm90-l1b-v2-logs.tgz") as tar:
    for m in sorted(tar.getmembers(), key=lambda m: m.name):
        hit = re.search(r"screen-tg-r(\d+)-(\w+)-tg\.log$", m.name)
        if not (m.isfile() and hit):
            continue
        for line in io.TextIOWrapper(tar.extractfile(m), errors="replace"):  # type: ignore[arg-type]
            if line.startswith("{") and "samples_ts" in line:
                rec = json.loads(line)
                kept = rec["samples_ts"][1:]  # the first repetition is discarded, as the search does
                key = (hit.group(2), int(rec["n_depth"]))
                within[key].append(100 * st.stdev(kept) / st.mean(kept))
                medians[key].append(st.median(kept))
for d in (0, 32768, 65536):
    for cand in ("upstream", "VEC", "TILE", "MMA"):
        ms = medians[(cand, d)]
        print(f"d{d:<6} {cand:<9} within-call CV {st.mean(within[(cand, d)]):.2f}%  "
              f"between-round CV of medians {100 * st.stdev(ms) / st.mean(ms):.2f}%  medians {[round(x, 1) for x in ms]}")
