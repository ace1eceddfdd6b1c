# Session 5 (issue 15) on the lent H100: the pipeline with shared prefill+decode calls, llama-3.1-8b shape.
# Source after docs/h100/env.sh. Every step leaves its transcript, logs and study database under $OUT.
#   s5_setup                                sm_90 build (variant cuda) + llama-3.2-1b and llama-3.1-8b shapes, Q4_K_M
#   s5_search NAME MODEL SECONDS [args]     resumable: rerun with the same NAME to continue
# M1, M8 and s4_setup (build + both shapes) are session 4's, unchanged.
. docs/h100/session4.sh

s5_setup() { s4_setup && echo "setup done at ${SECONDS} s"; }

s5_search() {
  local name=$1 model=$2 secs=$3
  mkdir -p "$TUNER_RUNS/$name"
  # A study database from this repo (seeded, or brought back from an earlier machine) continues there.
  [ -f "$TUNER_RUNS/$name/study.db" ] || [ ! -f "docs/h100/session5/$name.db" ] || cp "docs/h100/session5/$name.db" "$TUNER_RUNS/$name/study.db"
  # The database lives under $OUT, which comes back even when a call is killed at its limit.
  cp "$TUNER_RUNS/$name/study.db" "$OUT/$name.db" 2>/dev/null
  python3 -m tuner search --arch sm_90 --variant cuda --model "$model" --study "$name" --run-dir "$TUNER_RUNS/$name" \
    --storage "sqlite:///$OUT/$name.db" --time-budget "$secs" --jobs 16 "${@:4}" 2>&1 | tee -a "$OUT/search-$name.txt"
  cp "$OUT/$name.db" "$TUNER_RUNS/$name/study.db"
  tar czf "$OUT/$name-logs.tgz" --exclude '*.db' -C "$TUNER_RUNS" "$name" 2>/dev/null
  echo "call ended at ${SECONDS} s"
}

# The 8B settings of this session: the ladder up to 65536 (16384 and 32768 bracket upstream's own
# 8192 switch for larger GQA), 3 paired rounds (the device budget: a round of four shared calls
# takes about 200 s), 3 repetitions per call (the per-call spread is 0.2-2%, the per-round 0.4-2.8%:
# rounds, not repetitions, narrow the CI), no tune trials (the kernel rules are what this run proves).
L8_ARGS="--trials 0 --depths 0,16384,32768,65536 --reps-pp 3 --reps-tg 3 --min-rounds 3 --max-rounds 3 --refine 0"
