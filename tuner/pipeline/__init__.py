"""The search pipeline: screen -> compose -> tune -> confirm.

* :mod:`~tuner.pipeline.screen` measures upstream's kernel choice and every legal forced kernel per
  phase and depth in paired, interleaved rounds (runtime only, zero rebuilds);
* :mod:`~tuner.pipeline.compose` turns the screen into FlashAttention rules keyed by the model's
  shape, a kernel per depth interval, only where a kernel beat upstream beyond the A/A noise;
* :mod:`~tuner.pipeline.tune` runs Optuna only over what really is a joint search (compile-time
  rows, process-wide knobs) with the composed rules fixed;
* :mod:`~tuner.pipeline.confirm` re-measures the final config against upstream, paired, at every
  depth plus depths the screen did not use; only what confirms is exported.
"""
