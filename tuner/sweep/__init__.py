"""A shape-wide sweep of llama.cpp's FlashAttention kernel choice and MMQ-vs-cuBLAS choice (docs/sweep.md).

Unlike the search, which tunes one model end to end through llama-bench, the sweep times single ops at
exact shapes over a grid of head sizes, GQA ratios, K/V types, query columns and n_kv (or quant types
and batch sizes), forcing each legal kernel in paired, interleaved rounds with an A/A pair per cell;
the verdicts compose into one table per arch, emitted as a change to upstream's selection functions.

* :mod:`tuner.sweep.grid`: the grid, the legal kernels per cell, upstream's own choice, the dry run;
* :mod:`tuner.sweep.live`: the FlashAttention sweep as a spec of the round engine (:mod:`tuner.rounds.engine`:
  paired rounds over many cells per timer process, samples in SQLite, verdicts and their composition),
  its report (``tuner sweep run``);
* :mod:`tuner.sweep.table`: the composed FlashAttention table as C++ (``upstream.patch``), its Python
  matcher and a host-only harness of the emitted C++;
* :mod:`tuner.sweep.mmq`: the same for ``ggml_cuda_should_use_mmq`` (runtime hook, the MMQ sweep's spec and
  report, upstream condition; ``tuner sweep mmq``);
* :mod:`tuner.sweep.confirm`, :mod:`tuner.sweep.confirm_report`: the table confirmed end to end with
  llama-bench on model shapes, the entries kept or reported, ``e2e.md`` and ``PR.md`` (``tuner sweep confirm``).
"""
