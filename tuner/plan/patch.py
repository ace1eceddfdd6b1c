"""Kernel patches: the era's patch manifests (``templates/patches/<era>/*.toml``), anchored edits of the
pristine tree rendered from Jinja fragments, and the unified diff ``git apply`` takes."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path

import jinja2

from tuner._compat import tomllib
from tuner.errors import TunerError, UsageError, close_matches
from tuner.paths import data_dir

_MODES = ("replace", "insert_before", "insert_after")
_KEYS = ("description", "families", "opt_in", "edit")
_EDIT_KEYS = ("file", "mode", "anchor", "template", "vars")


@functools.lru_cache(maxsize=4)
def _env_for(folder: str) -> jinja2.Environment:
    """A strict Jinja environment over one templates folder (cached)."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(folder),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render_template(template: str, context: Mapping[str, object], *, what: str) -> str:
    """Render one template; TunerError names it (and ``what`` it is for) when it is missing or fails."""
    try:
        return _env_for(str(data_dir("templates"))).get_template(template).render(**context)
    except jinja2.TemplateNotFound as err:
        raise TunerError(f"Template {template!r} ({what}) was not found under {data_dir('templates')}.") from err
    except (jinja2.UndefinedError, jinja2.TemplateSyntaxError) as err:
        raise TunerError(f"Template {template!r} ({what}) failed to render: {err}. Fix the template.") from err


@dataclasses.dataclass(frozen=True, kw_only=True)
class Edit:
    """One anchored edit of a pristine file."""

    file: str
    """Path relative to the llama.cpp root."""
    mode: str
    """``replace``, ``insert_before`` or ``insert_after``."""
    anchor: str
    """Exact text that must occur exactly once in the pristine file."""
    template: str
    """Jinja fragment, relative to ``templates/``."""
    vars: Mapping[str, object] = dataclasses.field(default_factory=dict)
    """Extra template variables for this edit."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class PatchManifest:
    """A ``templates/patches/<era>/<name>.toml`` file."""

    name: str
    era: str
    path: Path
    description: str
    families: tuple[str, ...]
    edits: tuple[Edit, ...]
    opt_in: str = ""
    """Non-empty: the manifest applies only to builds that ask for this hook by name (``render_patch``'s
    ``opt_in``); e.g. the MMQ hook, which only the sweep's build carries."""


def load_manifests(era: str, *, base: Path | None = None) -> list[PatchManifest]:
    """Every patch manifest of an era, sorted by name; TunerError for unknown keys, a bad mode or a missing template."""
    root = (base or data_dir("templates")) / "patches"
    era_dir = root / era
    if not era_dir.is_dir():
        raise TunerError(f"No patch manifests for era {era!r} in {era_dir}.")
    out = []
    for path in sorted(era_dir.glob("*.toml")):
        try:
            doc = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as err:
            raise TunerError(f"Patch manifest {path} is not valid TOML: {err}.") from err
        for key in doc:
            if key not in _KEYS:
                raise TunerError(f"Unknown key {key!r} in {path}.{close_matches(key, _KEYS)}")
        edits = []
        for i, e in enumerate(doc.get("edit", [])):
            for key in e:
                if key not in _EDIT_KEYS:
                    raise TunerError(f"Unknown key {key!r} in edit {i + 1} of {path}.{close_matches(key, _EDIT_KEYS)}")
            if e.get("mode") not in _MODES:
                raise TunerError(f"Edit {i + 1} of {path}: mode {e.get('mode')!r} is not one of {', '.join(_MODES)}.")
            tpl = e["template"]
            rel = f"patches/{era}/{tpl}" if (era_dir / tpl).is_file() else f"patches/common/{tpl}"
            if not (root.parent / rel).is_file():
                msg = f"Edit {i + 1} of {path} names template {tpl!r}, found neither in {era_dir} nor in {root / 'common'}."
                raise TunerError(msg)
            edits.append(Edit(file=e["file"], mode=e["mode"], anchor=e["anchor"], template=rel, vars=e.get("vars", {})))
        out.append(
            PatchManifest(
                name=path.stem,
                era=era,
                path=path,
                description=doc.get("description", ""),
                families=tuple(doc.get("families", ())),
                edits=tuple(edits),
                opt_in=str(doc.get("opt_in", "")),
            )
        )
    return out


def _apply_edits(
    root: Path, era: str, manifests: Sequence[PatchManifest], context: Mapping[str, object]
) -> dict[str, str]:
    """Apply every edit in memory to pristine text; return relpath -> new text of changed files."""
    by_file: dict[str, list[tuple[int, int, str, PatchManifest, Edit]]] = {}
    pristine: dict[str, str] = {}
    for m in manifests:
        for e in m.edits:
            path = root / e.file
            if e.file not in pristine:
                if not path.is_file():
                    raise TunerError(
                        f"Patch template {m.name!r} (era {era}, {m.path}) edits {e.file}, which this tree lacks. "
                        f"The template targets a different llama.cpp version; fix the manifest or the --source."
                    )
                pristine[e.file] = path.read_text()
            text = pristine[e.file]
            count = text.count(e.anchor)
            if count != 1:
                first = e.anchor.strip().splitlines()[0] if e.anchor.strip() else e.anchor
                raise TunerError(
                    f"Patch template {m.name!r} (era {era}, {m.path}): the anchor starting {first[:80]!r} occurs "
                    f"{count} times in {e.file}; it must occur exactly once. The tree does not match the template's "
                    f"llama.cpp version; fix the anchor or use a source of era {era}."
                )
            fragment = render_template(e.template, {**context, **e.vars}, what=f"edit of {e.file} in {m.name}")
            start = text.index(e.anchor)
            end = start + len(e.anchor)
            if e.mode == "replace":
                span = (start, end)
            else:
                if not fragment:
                    continue  # nothing to insert in this mode (e.g. a hook that only exists in tune mode)
                pos = start if e.mode == "insert_before" else end
                if e.mode == "insert_after" and not e.anchor.endswith("\n") and text[pos : pos + 1] == "\n":
                    pos += 1  # insert whole lines after the anchor's line
                span = (pos, pos)
            by_file.setdefault(e.file, []).append((span[0], span[1], fragment, m, e))
    files: dict[str, str] = {}
    for rel, edits in by_file.items():
        edits.sort(key=lambda t: (t[0], t[1]))
        for (_s0, e0, _, m0, _), (s1, _, _, m1, _) in itertools.pairwise(edits):
            if s1 < e0:
                msg = f"Patch templates {m0.name!r} and {m1.name!r} (era {era}) edit overlapping text of {rel}."
                raise TunerError(msg)
        text = pristine[rel]
        for start, end, frag, _, _ in reversed(edits):
            text = text[:start] + frag + text[end:]
        if text != pristine[rel]:
            files[rel] = text
    return files


def unified_diff(rel: str, old: str, new: str) -> str:
    """A ``git apply``-compatible unified diff of one file with ``a/`` and ``b/`` headers."""
    lines = difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{rel}", f"b/{rel}")
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def patched_file(source_root: Path, era: str, manifest: str, rel: str, *, templates: Path | None = None) -> str:
    """The text of ``rel`` after the one manifest named ``manifest`` (its file stem) alone is applied to
    the pristine tree; for a manifest whose templates need no variant context (an opt-in hook). TunerError
    when there is no such manifest, it does not change ``rel``, or an anchor does not match the tree.
    """
    found = [m for m in load_manifests(era, base=templates) if m.name == manifest]
    if not found:
        raise TunerError(f"No patch manifest {manifest!r} for era {era!r}.")
    files = _apply_edits(source_root, era, found, {"era": era})
    if rel not in files:
        raise TunerError(f"Patch manifest {manifest!r} does not change {rel}.")
    return files[rel]


def render_patch(
    source_root: Path,
    era: str,
    family: str,
    context: Mapping[str, object],
    *,
    templates: Path | None = None,
    opt_in: Sequence[str] = (),
) -> tuple[str, dict[str, str]]:
    """Render the era's manifests for a variant family into ``(patch, files)``; an opt-in manifest only
    where ``opt_in`` names its hook (UsageError for a hook the era has no manifest of for this family)."""
    manifests = [m for m in load_manifests(era, base=templates) if family in m.families]
    known = sorted({m.opt_in for m in manifests if m.opt_in})  # the era's opt-in hooks for the family
    unknown = [h for h in opt_in if h not in known]
    if unknown:
        raise UsageError(
            f"No opt-in hook {unknown[0]!r} for {family} builds of era {era}; the hooks there are: "
            f"{', '.join(known) or 'none'}.{close_matches(unknown[0], known)}"
        )
    manifests = [m for m in manifests if not m.opt_in or m.opt_in in opt_in]
    files = _apply_edits(source_root, era, manifests, {"era": era, "family": family, **context})
    patch = "".join(unified_diff(rel, (source_root / rel).read_text(), files[rel]) for rel in sorted(files))
    return patch, files
