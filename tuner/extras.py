"""Optional dependencies: which extra provides a module, and the pip command that installs it."""

from __future__ import annotations

from pathlib import Path

from tuner.errors import UsageError

_REPO = Path(__file__).resolve().parent.parent

OPTIONAL_MODULES: dict[str, tuple[str, str]] = {
    # module -> (extra in pyproject.toml, what needs it)
    "psycopg": ("postgres", "PostgreSQL study storage (--storage postgresql+psycopg://...)"),
    "psycopg_binary": ("postgres", "PostgreSQL study storage (--storage postgresql+psycopg://...)"),
    "pynvml": ("nvml", "GPU utilization and clocks from NVML"),
    "pyarrow": ("parquet", "Parquet copies of bench results"),
}


def install_command(extra: str) -> str:
    """``pip install -e '/path/to/tuner[extra]'`` for a source checkout, else ``pip install 'tuner[extra]'``."""
    if (_REPO / "pyproject.toml").is_file():
        return f"python3 -m pip install -e '{_REPO}[{extra}]'"
    return f"python3 -m pip install 'tuner[{extra}]'"


def missing_module_error(err: ImportError) -> UsageError | None:
    """A UsageError naming the extra to install when ``err`` is a missing optional module, else None."""
    name = (getattr(err, "name", None) or "").split(".")[0]
    if name == "psycopg2":  # SQLAlchemy's default driver for a bare postgresql:// URL
        return UsageError(
            "the storage URL postgresql://... asks SQLAlchemy for its default driver psycopg2, which is "
            "not installed. tuner's postgres extra installs psycopg 3: run "
            f"`{install_command('postgres')}` and write the URL as postgresql+psycopg://USER@HOST/DB."
        )
    if name not in OPTIONAL_MODULES:
        return None
    extra, feature = OPTIONAL_MODULES[name]
    return UsageError(
        f"{feature} needs the Python module {name!r}, which is not installed. It comes with tuner's "
        f"{extra!r} extra: run `{install_command(extra)}` and rerun the command."
    )
