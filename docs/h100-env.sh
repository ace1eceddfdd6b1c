# Source this on a GPU machine without network, from the repository root, before any tuner command of
# docs/h100.md. It needs two folders carried there: .whl (the wheels of tuner's dependencies for the
# machine's Python, `pip download`) and .carry (`tuner source pack -o .carry/llama-0.3.36.tgz`).
# TUNER_HOME is .devhome (ignored by git), so builds and models stay there between calls.
export PYTHONUNBUFFERED=1
if [ ! -d /tmp/site/optuna ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
fi
export PYTHONPATH=/tmp/site:$PWD
export TUNER_HOME=$PWD/.devhome
export TUNER_RUNS=$PWD/.devhome/runs
tuner() { python3 -m tuner "$@"; }
[ -d "$TUNER_HOME/sources/832db0699007f1be" ] || python3 -m tuner source unpack .carry/llama-0.3.36.tgz
