"""One vocabulary across commands: every writer's -o/--output, one depth option, one rounds/repetitions
naming, the shared --quant default, did-you-mean for subcommands, the exit-status list, and an A/A pair
that is two runs. Old spellings keep working for one release and print one deprecation line.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from tests.unit.result.test_report import _frame
from tuner.cli import cli
from tuner.measure.frames import save_results

REPO = Path(__file__).resolve().parents[3]
DEPRECATED = "tuner: {old} is deprecated, use {new}; the old spelling goes in the next release"


def _run(args: list[str]) -> Result:
    return CliRunner().invoke(cli, args)


def _commands(cmd: click.Command = cli, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """Every command and group under ``tuner``, recursively, with its path."""
    yield path, cmd
    if isinstance(cmd, click.Group):
        ctx = click.Context(cmd)
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            assert sub is not None, name
            yield from _commands(sub, (*path, name))


def _visible(opt: click.Option) -> list[str]:
    """The spellings --help shows (hidden aliases left out)."""
    rec = opt.get_help_record(click.Context(click.Command("x")))
    return [] if opt.hidden or rec is None else [w for w in re.split(r"[ ,/]+", rec[0]) if w.startswith("-")]


# ---------------------------------------------------------------- -o/--output

# Path parameters a command READS (they may be missing: the command resolves or refuses them itself).
_INPUTS = {
    ("estimate", "model_path"),
    ("model", "synth", "quantize_with"),
    ("model", "synth", "vocab_path"),
    ("search", "model"),
    ("worker", "model"),
    ("build", "pack_in"),
    ("export", "run_dir"),  # the run folder whose study is exported
    ("validate", "paths"),
    ("validate", "models"),
    ("validate", "upstream_bin"),
    ("validate", "tuned_bin"),
    ("validate", "from_pack"),
    ("source", "unpack", "archive"),
}
# Path options that write something BESIDE the command's product, named for what they are. Each has its
# reason; anything else that takes a path it may create must be the command's -o/--output.
_SIDE_OUTPUTS = {
    # compare's product is its table on stdout; --plot FILE is compare-llama-bench.py's own spelling (whose
    # -o/--output is the table's format, as tuner compare's --format is)
    ("compare", "plot_path"): "compare-llama-bench.py --plot",
    ("search", "run_dir"): "the study's run folder (the product, the export, is -o)",
    ("worker", "run_dir"): "the study's run folder",
    ("build", "pack_out"): "a pack of the build, whose product is the cached build folder",
    ("validate", "log_dir"): "logs of the --gpu checks",
    ("validate", "pack"): "a pack for another machine's --gpu check",
    ("toolchain", "hip", "prefix"): "where the toolchain is installed (as cmake --install --prefix)",
    ("sweep", "run", "storage"): "the samples' database (default: in -o)",
    ("sweep", "mmq", "storage"): "the samples' database (default: in -o)",
    ("sweep", "confirm", "storage"): "the samples' database (default: in -o)",
}


def _path_params() -> Iterator[tuple[tuple[str, ...], click.Parameter]]:
    for path, cmd in _commands():
        for p in cmd.params:
            if isinstance(p.type, click.Path) and not p.type.exists:
                yield (*path, str(p.name)), p


def test_every_writer_is_dash_o_output() -> None:
    """Each path parameter a command may create is its -o/--output, or a named side output, or an input."""
    seen: set[tuple[str, ...]] = set()
    for key, p in _path_params():
        seen.add(key)
        if key in _INPUTS or key in _SIDE_OUTPUTS:
            continue
        assert isinstance(p, click.Option), f"{key}: a positional path a command writes; make it -o/--output"
        assert "-o" in p.opts and "--output" in p.opts, f"{key}: {p.opts} writes a file or folder: spell it -o/--output"
        assert [o for o in _visible(p) if o.startswith("-")][:2] == ["-o", "--output"], (key, _visible(p))
    assert ("report", "out_dir") in seen  # report -o writes report.md and depth.png
    stale = (_INPUTS | set(_SIDE_OUTPUTS)) - seen
    assert not stale, f"listed but no longer a path parameter: {stale}"


def test_every_dash_o_is_output() -> None:
    for path, cmd in _commands():
        for p in cmd.params:
            if isinstance(p, click.Option) and "-o" in p.opts:
                assert "--output" in p.opts, (path, p.opts)


def test_report_writes_with_output_and_out_is_deprecated(tmp_path: Path) -> None:
    save_results(_frame("base", {"pp": 1, "tg": 1}), tmp_path / "base")
    save_results(_frame("new", {"pp": 1.2, "tg": 1}, seed=3), tmp_path / "new")
    files = [str(tmp_path / "base.jsonl"), str(tmp_path / "new.jsonl")]
    r = _run(["report", *files, "--output", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "a" / "report.md").is_file() and "deprecated" not in r.stderr
    r = _run(["report", *files, "--out", str(tmp_path / "b")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "b" / "report.md").read_text() == (tmp_path / "a" / "report.md").read_text()
    assert DEPRECATED.format(old="--out", new="-o/--output") in r.stderr.splitlines()
    assert r.stderr.count("deprecated") == 1
    help_text = _run(["report", "--help"]).stdout
    assert re.search(r"^\s+-o, --output\b", help_text, re.M) and "--out " not in help_text


@pytest.mark.parametrize("args", [["sweep", "run"], ["bench"], ["export"], ["search"]], ids=" ".join)
def test_out_and_export_still_parse_with_the_line(args: list[str], tmp_path: Path) -> None:
    """The old long spellings of -o/--output stay accepted (parsed, then the command's own checks run)."""
    old = "--export" if args == ["search"] else "--out"
    r = _run([*args, old, str(tmp_path / "x"), "--no-such-flag"])
    assert r.exit_code == 2 and f"No such option '{old}'" not in r.output, r.output
    assert r.stderr.splitlines()[0] == DEPRECATED.format(old=old, new="-o/--output")


# ---------------------------------------------------------------- depths


def test_one_depth_spelling_across_commands() -> None:
    """Every visible option taking KV depths is --depths (or --tune-depths) with the shared comma-list parser."""
    from tuner.cli._params import depths_option

    for path, cmd in _commands():
        for p in cmd.params:
            if not isinstance(p, click.Option) or "depth" not in str(p.name) or p.hidden:
                continue
            assert p.opts[-1] in ("--depths", "--tune-depths"), (path, p.opts)
            assert p.callback is depths_option, (path, p.opts)


def test_estimate_depths_and_the_old_depth() -> None:
    base = ["estimate", "--arch", "sm_90", "--like", "llama-3.2-1b", "--json"]
    new = _run([*base, "--depths", "0,4096"])
    assert new.exit_code == 0, new.output
    old = _run([*base, "--depth", "4096", "--depth", "0"])
    assert old.exit_code == 0, old.output
    assert old.stdout == new.stdout and "deprecated" not in new.stderr
    assert DEPRECATED.format(old="--depth", new="--depths") in old.stderr.splitlines()
    assert '"depth": 4096' in new.stdout
    assert "--depth " not in _run(["estimate", "--help"]).stdout
    bad = _run([*base, "--depths", "0,x"])
    assert bad.exit_code == 2 and "comma-separated list of integers" in bad.output


# ---------------------------------------------------------------- rounds and repetitions


def test_rounds_options_go_together() -> None:
    """Where a command has paired rounds it takes --rounds N (both) and --min-rounds/--max-rounds."""
    with_rounds = set()
    for path, cmd in _commands():
        names = {o for p in cmd.params if isinstance(p, click.Option) and not p.hidden for o in p.opts}
        if names & {"--rounds", "--min-rounds", "--max-rounds"}:
            with_rounds.add(path)
            assert {"--rounds", "--min-rounds", "--max-rounds"} <= names, (path, sorted(names))
    assert {("ab",), ("search",), ("worker",), ("sweep", "run"), ("sweep", "confirm")} <= with_rounds


def _limits(*args: str) -> tuple[int, int | None]:
    from tuner.cli._params import round_limits, rounds_option

    got: list[tuple[int, int | None]] = []

    @click.command()
    @rounds_option()
    @click.option("--min-rounds", type=int, default=3)
    @click.option("--max-rounds", type=int, default=None)
    def cmd(rounds: int | None, min_rounds: int, max_rounds: int | None) -> None:
        got.append(round_limits(click.get_current_context(), rounds, min_rounds, max_rounds))

    r = CliRunner().invoke(cmd, list(args), standalone_mode=False)
    if r.exception:
        raise r.exception
    return got[0]


def test_round_limits() -> None:
    from tuner.errors import UsageError

    assert _limits() == (3, None)
    assert _limits("--rounds", "5") == (5, 5)
    assert _limits("--rounds", "3", "--max-rounds", "6") == (3, 6)  # sweep confirm's reading, kept
    assert _limits("--min-rounds", "4", "--max-rounds", "8") == (4, 8)
    assert _limits("--rounds", "4", "--min-rounds", "4") == (4, 4)
    with pytest.raises(UsageError, match="disagree"):
        _limits("--rounds", "4", "--min-rounds", "2")
    with pytest.raises(UsageError, match="below --min-rounds"):
        _limits("--rounds", "5", "--max-rounds", "3")


def test_search_rounds_and_reps_mean_both(monkeypatch: pytest.MonkeyPatch) -> None:
    """search's --rounds N is --min-rounds N --max-rounds N, its --reps N is --reps-pp N --reps-tg N (a phase's
    own flag wins), as ab, bench and sweep confirm read --rounds and --reps."""
    from tuner.cli import search_cmd

    seen = []

    def fake(request: object, export_dir: object) -> object:
        seen.append(request)
        return object()

    monkeypatch.setattr("tuner.cli.export_cmd.search_and_export", fake)
    r = _run(["search", "--arch", "cpu", "--rounds", "4", "--reps", "5", "--reps-tg", "2"])
    assert r.exit_code == 0, r.output
    req = seen[-1]
    assert (req.min_rounds, req.max_rounds, req.reps_pp, req.reps_tg) == (4, 4, 5, 2)  # type: ignore[attr-defined]
    r = _run(["search", "--arch", "cpu", "--min-rounds", "2"])
    assert r.exit_code == 0, r.output
    req = seen[-1]
    assert (req.min_rounds, req.max_rounds, req.reps_pp, req.reps_tg) == (2, None, None, None)  # type: ignore[attr-defined]
    assert search_cmd.search is not None


# ---------------------------------------------------------------- --quant default


@pytest.mark.parametrize("arch", ["sm_90", "cpu"])
def test_estimate_quant_default_is_the_searchs(arch: str) -> None:
    """estimate --like without --quant estimates the weight type `tuner search` would synthesize there."""
    from tuner.search.request import CPU_DEFAULTS, GPU_DEFAULTS

    want = (CPU_DEFAULTS if arch == "cpu" else GPU_DEFAULTS).quant or "f16"
    base = ["estimate", "--arch", arch, "--like", "tiny", "--depths", "0", "--json", "--bandwidth", "50"]
    default, explicit = _run(base), _run([*base, "--quant", want])
    assert default.exit_code == 0 and explicit.exit_code == 0, default.output + explicit.output
    assert default.stdout == explicit.stdout
    other = "f16" if want.lower() != "f16" else "q8_0"
    assert _run([*base, "--quant", other]).stdout != default.stdout
    assert want in _run(["estimate", "--help"]).stdout


# ---------------------------------------------------------------- did you mean


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["serch"], "Error: No such command 'serch'. Did you mean 'search'?"),
        (["sweep", "rn"], "Error: No such command 'rn'. Did you mean 'run'?"),
        (["xyzzyq"], "Error: No such command 'xyzzyq'."),
    ],
)
def test_a_mistyped_subcommand_gets_did_you_mean_and_exit_2(args: list[str], want: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "tuner", *args], capture_output=True, text=True, timeout=120, cwd=REPO, check=False
    )
    assert r.returncode == 2, r.stderr
    assert want in r.stderr.splitlines(), r.stderr
    if args == ["xyzzyq"]:
        assert "Did you mean" not in r.stderr


def test_every_group_suggests() -> None:
    for path, cmd in _commands():
        if isinstance(cmd, click.Group) and cmd.list_commands(click.Context(cmd)):
            first = cmd.list_commands(click.Context(cmd))[0]
            r = _run([*path, first + "x"])
            assert r.exit_code == 2 and f"Did you mean '{first}'" in r.output, (path, r.output)


# ---------------------------------------------------------------- exit statuses


def _help_statuses() -> dict[int, str]:
    text = _run(["--help"]).stdout
    part = text.split("Exit status:", 1)[1]
    return {int(m[1]): m[2] for m in re.finditer(r"^\s+(\d+)\s+(.+)$", part, re.M)}


def test_the_exit_status_list_matches_the_codes() -> None:
    from tuner import crash
    from tuner.errors import EXIT_STATUSES, EXIT_TIME_BUDGET, TunerError, UsageError

    listed = _help_statuses()
    assert set(listed) == set(EXIT_STATUSES)
    assert {0, TunerError.exit_code, UsageError.exit_code, EXIT_TIME_BUDGET, crash.EXIT_INTERNAL, 130} == set(listed)
    assert "--time-budget" in listed[EXIT_TIME_BUDGET]
    # every literal status the code exits with is in the list
    used = set()
    for p in (REPO / "tuner").rglob("*.py"):
        used |= {int(x) for x in re.findall(r"sys\.exit\((\d+)\)", p.read_text())}
    assert used and used <= set(listed), used - set(listed)
    # the list in docs/reliability.md names 3 too
    head = (REPO / "docs" / "reliability.md").read_text().split("\n## ", 1)[0]
    assert all(re.search(rf"\b{c}\b", head) for c in listed), head


# ---------------------------------------------------------------- --aa A A


@pytest.mark.parametrize("cmd", ["compare", "report"])
def test_an_aa_pair_of_one_run_is_refused(cmd: str, tmp_path: Path) -> None:
    from tuner.errors import UsageError

    save_results(_frame("base", {"pp": 1, "tg": 1}), tmp_path / "base")
    save_results(_frame("new", {"pp": 1.2, "tg": 1}, seed=3), tmp_path / "new")
    a, b = str(tmp_path / "base.jsonl"), str(tmp_path / "new.jsonl")
    shutil.copy(a, tmp_path / "copy.jsonl")
    for aa in ([a, a], [a, str(tmp_path / "." / "base.jsonl")], [a, str(tmp_path / "copy.jsonl")]):
        r = CliRunner().invoke(cli, [cmd, a, b, "--aa", *aa], standalone_mode=False)
        assert isinstance(r.exception, UsageError) and r.exception.exit_code == 2, r.output
        assert "an A/A pair needs two runs of build A" in str(r.exception)
    save_results(_frame("base", {"pp": 1.01, "tg": 1}, seed=7), tmp_path / "base2")
    r = _run([cmd, a, b, "--aa", a, str(tmp_path / "base2.jsonl")])
    assert r.exit_code == 0, r.output
