# The sm_90 search of issue 7, as run on the lent H100 (source this after docs/h100/env.sh).
# Usage: search_sm90 SECONDS   -- runs (or resumes) the study for about SECONDS more.
M=$TUNER_HOME/models/l1b-q4km.gguf
# Compile-time: the D=64 prefill MMA row (nthreads x occupancy); the other row fields and the D=128
# row (a head size this model never uses) stay at upstream so each candidate rebuilds one TU.
PINS="--set mma.ampere.d64.c64.nbatch_fa=64 --set mma.ampere.d64.c64.nbatch_K2=32 --set mma.ampere.d64.c64.nbatch_V2=32
 --set mma.ampere.d64.c64.nbatch_combine=32 --set mma.ampere.d64.c64.nstages_target=2 --set mma.ampere.d64.c64.Q_in_reg=1
 --set mma.ampere.d128.c64.nthreads=128 --set mma.ampere.d128.c64.occupancy=2 --set mma.ampere.d128.c64.nbatch_fa=64
 --set mma.ampere.d128.c64.nbatch_K2=64 --set mma.ampere.d128.c64.nbatch_V2=64 --set mma.ampere.d128.c64.nbatch_combine=64
 --set mma.ampere.d128.c64.nstages_target=2 --set mma.ampere.d128.c64.Q_in_reg=1"
search_sm90() {
  python3 -m tuner search --arch sm_90 --variant cuda --model "$M" --depths 0,4096,16384,32768 \
    --study sm90-llama-3.2-1b-q4km --run-dir "$TUNER_RUNS/sm90-l1b" --trials 500 --time-budget "$1" \
    --jobs 16 $PINS --export "$TUNER_RUNS/sm90-l1b/export"
}
