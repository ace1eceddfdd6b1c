#!/bin/sh
# Re-export every stored result in results/ from the study database it was exported from (docs/h100/,
# docs/cpu-default/), with this checkout's export code; no GPU or model is needed. Then check them.
# Run from the repository root after any change to what an export writes.
set -eu
# Every stored result was measured on a model that `tuner model synth --like SHAPE [--quant TYPE]` made
# (random weights of the named shape); the studies predate recording that, so it is passed here and
# PR.md's "Models" section says so.
export_one() {  # result folder, study name, database, shape, weight type
    tuner export --study "$2" --storage "sqlite:///$3" -o "results/$1" --like "$4" --weight-type "$5"
}
export_one sm_90/llama-3.2-1b-q4_k_m sm90-l1b-v3 docs/h100/session9/call5/sm90-l1b-v3.db llama-3.2-1b q4_k_m
export_one sm_90/llama-3.1-8b-q4_k_m sm90-l8b-v3 docs/h100/session9/call5/sm90-l8b-v3.db llama-3.1-8b q4_k_m
export_one sm_90/llama-3.2-1b-q4_k_m-ngl8-cpus0-3 paced-4 docs/h100/session14/call1/paced-4.db llama-3.2-1b q4_k_m
export_one sm_89/llama-3.2-1b-q4_k_m-measured-on-h100 sm89-l1b-v4 docs/h100/session12/call2/sm89-l1b-v4.db llama-3.2-1b q4_k_m
export_one cpu/tiny-f16 cpu-tiny-f16-s0-832db069-mma docs/cpu-default/study.db tiny f16
tuner validate results/
