#!/bin/sh
# Re-export every stored result in results/ from the study database it was exported from (each result's
# evidence/study.db.xz), with this checkout's export code; no GPU or model is needed. Then check them.
# Run from the repository root after any change to what an export writes.
set -eu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Every stored result was measured on a model that `tuner model synth --like SHAPE [--quant TYPE]` made
# (random weights of the named shape); the studies predate recording that, so it is passed here and
# PR.md's "Models" section says so.
export_one() {  # result folder, study name, shape, weight type
    dir="results/$1"
    # SQLite reads a plain file; the export goes to a fresh folder (an export replaces its folder whole, and
    # evidence/ is not an export's), then its files replace the result's top-level files.
    xz -dc "$dir/evidence/study.db.xz" > "$tmp/study.db"
    rm -rf "$tmp/out"
    tuner export --study "$2" --storage "sqlite:///$tmp/study.db" -o "$tmp/out" --like "$3" --weight-type "$4"
    find "$dir" -maxdepth 1 -type f -delete
    cp "$tmp"/out/* "$dir"/
}
export_one sm_90/llama-3.2-1b-q4_k_m sm90-l1b-v3 llama-3.2-1b q4_k_m
export_one sm_90/llama-3.2-1b-q4_k_m-default-search sm_90-llama-3.2-1b-q4_k_m-s0-832db069-mma llama-3.2-1b q4_k_m
export_one sm_90/llama-3.2-1b-q4_k_m-decode-tune sm_90-llama-3.2-1b-q4_k_m-s0-832db069-mma llama-3.2-1b q4_k_m
export_one sm_90/llama-3.1-8b-q4_k_m sm90-l8b-v3 llama-3.1-8b q4_k_m
export_one sm_90/llama-3.1-8b-q4_k_m-default-search sm_90-llama-3.1-8b-q4_k_m-s0-832db069-mma llama-3.1-8b q4_k_m
export_one sm_90/llama-3.1-8b-q4_k_m-decode-tune sm_90-llama-3.1-8b-q4_k_m-s0-832db069-mma llama-3.1-8b q4_k_m
export_one sm_90/llama-3.2-1b-q4_k_m-ngl8-cpus0-3 paced-4 llama-3.2-1b q4_k_m
export_one sm_89/llama-3.2-1b-q4_k_m-measured-on-h100 sm89-l1b-v4 llama-3.2-1b q4_k_m
export_one cpu/tiny-f16 cpu-tiny-f16-s0-832db069-mma tiny f16
export_one cpu/smollm2-135m-q4_k_m cpu-smollm2-135m-q4_k_m-direct-s0-832db069-mma smollm2-135m q4_k_m
# The merged Hopper table, merged again from its two parts and the H200's confirmation stores
# (docs/data/h200-pipeline); its evidence/ folder is written by hand and kept.
ht=results/sm_90/hopper-table
cp -r "$ht/parts/fattn-mmq-table" "$ht/parts/fattn-ne1-table" "$tmp/"
h200=docs/data/h200-pipeline
tuner sweep merge "$tmp/fattn-mmq-table" "$tmp/fattn-ne1-table" -o "$tmp/hopper-table" \
    --gpu "$h200/confirm" --gpu "$h200/confirm-ne1" --gpu "$h200/ub512-iq4_xs" --gpu "$h200/ub512-q5_k_m"
cp -r "$ht/evidence" "$tmp/hopper-table/"
rm -rf "$ht" && cp -r "$tmp/hopper-table" "$ht"
tuner validate results/
