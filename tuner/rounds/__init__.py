"""The round engine that the search and the sweep both use: paired rounds, per-point statistics, the
A/A-controlled verdicts, their composition into intervals, and the time budget. It sits below both
:mod:`tuner.search` and :mod:`tuner.sweep`, so neither imports the other."""
