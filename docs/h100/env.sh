# Source this on the GPU machine (no network there): carried wheels + carried pinned source.
# Carried folders: .whl (optuna, sqlalchemy, alembic, gguf, tomli-w... for Python 3.12) and .carry
# (`tuner source pack -o .carry/llama-0.3.36.tgz`). TUNER_HOME is .devhome, ignored by .gitignore and
# not carried, so the GPU machine keeps builds there between calls while it stays warm.
export PYTHONUNBUFFERED=1
if [ ! -d /tmp/site/optuna ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
fi
export PYTHONPATH=/tmp/site:$PWD
export TUNER_HOME=$PWD/.devhome
export TUNER_RUNS=$PWD/.devhome/runs
tuner() { python3 -m tuner "$@"; }
[ -d "$TUNER_HOME/sources/832db0699007f1be" ] || python3 -m tuner source unpack .carry/llama-0.3.36.tgz
