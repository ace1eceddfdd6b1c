"""Measure a build: llama-bench runs (``bench``), GPU observers (``observe``), the test-backend-ops
correctness gate (``gate``) and the statistics that compare runs (``stats``)."""
