"""A shape-wide sweep of llama.cpp's FlashAttention kernel choice and MMQ-vs-cuBLAS choice (docs/sweep.md).

Unlike the search, the sweep times single ops at exact shapes, each legal kernel forced in paired rounds with an
A/A pair; the verdicts compose into one table per arch, confirmed end to end and emitted as an upstream change.
"""
