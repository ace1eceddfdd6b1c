"""A shape-wide sweep of llama.cpp's FlashAttention kernel choice and MMQ-vs-cuBLAS choice (docs/sweep.md).

Unlike the search, which tunes one model end to end, the sweep times single ops at exact shapes over a grid,
forcing each legal kernel in paired, interleaved rounds with an A/A pair per cell; the verdicts compose into one
table per arch (:mod:`~tuner.sweep.grid`, :mod:`~tuner.sweep.live`, :mod:`~tuner.sweep.table`,
:mod:`~tuner.sweep.mmq`), confirmed end to end on model shapes (:mod:`~tuner.sweep.confirm`) and emitted as a
change to upstream's selection functions.
"""
