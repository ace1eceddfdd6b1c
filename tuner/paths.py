"""Where tuner keeps its caches and where its data files live."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from tuner.errors import UsageError

_PKG = Path(__file__).resolve().parent


def tuner_home() -> Path:
    """``$TUNER_HOME``, else ``$XDG_CACHE_HOME/tuner``, else ``~/.cache/tuner``; created on first use.

    UsageError when the folder cannot be created or written (a file is in the way, no permission).
    """
    raw = os.environ.get("TUNER_HOME")
    # XDG base directory spec: a relative XDG_CACHE_HOME is invalid and must be ignored.
    xdg = os.environ.get("XDG_CACHE_HOME")
    cache = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    home = Path(raw or cache / "tuner").expanduser()
    try:
        home.mkdir(parents=True, exist_ok=True)
        why = None if os.access(home, os.W_OK | os.X_OK) else "it is not writable"
    except FileExistsError:
        why = "it is a file, not a folder"
    except NotADirectoryError:
        why = "a file is in the way of one of its parent folders"
    except OSError as err:
        why = f"it cannot be created ({err.strerror or err})"
    if why is not None:
        what = f"TUNER_HOME={raw}" if raw else f"tuner's cache folder {home}"
        fix = (
            f"Point TUNER_HOME at a writable folder (it is created if missing), or unset it to use {cache / 'tuner'}."
            if raw
            else "Set TUNER_HOME (or XDG_CACHE_HOME) to a writable folder."
        )
        raise UsageError(
            f"{what} is not usable: {why}. tuner keeps fetched llama.cpp sources, builds, models and logs there. {fix}"
        )
    return home


def data_dir(name: str) -> Path:
    """A top-level data folder (``templates``, ``search_spaces``).

    In a source checkout (editable install) it is the repo's folder; in a wheel it is the copy
    hatch puts under ``tuner/_data``.
    """
    for cand in (_PKG.parent / name, _PKG / "_data" / name):
        if cand.is_dir():
            return cand
    raise FileNotFoundError(f"tuner data folder {name!r} not found next to {_PKG}")


def package_data(name: str) -> Path:
    """A file shipped inside the package (``tuner/data/NAME``)."""
    return _PKG / "data" / name


def write_into(folder: Path, name: str, data: str | bytes) -> Path:
    """Write ``folder/name`` without following a link already there: the data goes to a temporary file in ``folder``,
    renamed over the name (a rename replaces a link, it never writes where the link points). A reader never sees half a
    file either. Returns the path written; UsageError where ``folder/name`` is a folder (a rename would not replace it).
    """
    path = folder / name
    if path.is_dir() and not path.is_symlink():
        raise UsageError(f"{path} is a folder where tuner writes a file. Move it away, or choose another -o.")
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes it 0600; an output file gets the usual mode
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def subfolder(folder: Path, name: str) -> Path:
    """``folder/name``, made where missing, never through a link: a link there would send every file
    written into it wherever it points. UsageError where ``folder/name`` is a link or not a folder.
    """
    path = folder / name
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise UsageError(
            f"{path} is a link or a file, where tuner writes a folder of its own; it does not write through a "
            "link. Remove it, or choose another -o."
        )
    path.mkdir(exist_ok=True)
    return path


def refuse_links_inside(folder: Path, option: str = "-o") -> None:
    """Refuse an output folder that already holds a symbolic link anywhere below it. Commands that write their logs,
    stores and reports into an existing ``-o`` open files by name; a link left there (by another user, or copied in with
    someone's run) would send those writes wherever it points. ``folder`` itself may be a link: the user named it. The
    UsageError names the first link found, where it points, and ``option``, the flag that chose the folder.
    """
    if not folder.is_dir():
        return
    for top, dirs, files in os.walk(folder):  # followlinks=False: a linked folder is listed, not entered
        for name in sorted(dirs + files):
            path = Path(top) / name
            if path.is_symlink():
                raise UsageError(
                    f"{path} is a symbolic link (to {os.readlink(path)!r}) inside the output folder {folder}. "
                    "tuner writes its logs, stores and reports there by name and does not write through links "
                    f"it finds: remove the link, or choose another {option}."
                )


def refuse_linked_folder(folder: Path, option: str) -> Path:
    """``folder``, a folder tuner keeps its own files in and writes in place (a search's run dir: the study
    database, its locks, logs and export), refused where it is a symbolic link or holds one below it: either
    would send those writes wherever the link points. Returns ``folder`` (it need not exist yet); the
    UsageError names ``option``, the flag.
    """
    if folder.is_symlink():
        raise UsageError(
            f"{option} {folder} is a symbolic link (to {os.readlink(folder)!r}). tuner writes the files of this "
            f"folder (a study database, locks, logs) by name and does not write through links: pass the folder "
            f"it points to, or choose another {option}."
        )
    refuse_links_inside(folder, option)
    return folder


def current_umask() -> int:
    """The process's umask (read by setting it and back)."""
    cur = os.umask(0)
    os.umask(cur)
    return cur
