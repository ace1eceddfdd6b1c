"""Storage passwords never reach a screen, a log, a crash log or an export (tuner.redact)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

import tuner.log
from tuner import crash
from tuner.cli import main
from tuner.redact import MASK, redact, redact_argv

PG = "postgresql+psycopg://tuner:s3cr3t-pw@db.example:5433/optuna"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (PG, "postgresql+psycopg://tuner:***@db.example:5433/optuna"),
        ("postgresql://u:p@ss/w@rd@host/db", "postgresql://u:***@host/db"),  # unencoded '@' and '/' in the password
        ("mysql://:only-pw@h/db", "mysql://:***@h/db"),
        ("cannot open 'postgresql://u:pw@h:1/db': refused", "cannot open 'postgresql://u:***@h:1/db': refused"),
        (
            "postgresql://h/db?user=u&password=pw&sslmode=require",
            "postgresql://h/db?user=u&password=***&sslmode=require",
        ),
        ("postgresql://user@host/db", "postgresql://user@host/db"),  # no password: nothing to hide
        ("sqlite:////tmp/a:b@c/study.db", "sqlite:////tmp/a:b@c/study.db"),  # a path, not userinfo
        ("postgresql://host:5432/db mail x@y.org", "postgresql://host:5432/db mail x@y.org"),
    ],
)
def test_redact_hides_the_password_and_keeps_the_rest(text: str, want: str) -> None:
    assert redact(text) == want
    assert redact(want) == want  # idempotent: a redacted text is left as it is


def test_redact_argv_covers_both_option_spellings() -> None:
    argv = ["search", "--storage", PG, f"--storage={PG}", "--trials", "1"]
    out = redact_argv(argv)
    assert all("s3cr3t-pw" not in a for a in out) and out[0] == "search" and out[-1] == "1"
    assert out[2].endswith(":***@db.example:5433/optuna") and out[3].startswith(
        "--storage=postgresql+psycopg://tuner:***@"
    )


_PW = hs.text(
    alphabet=hs.characters(blacklist_categories=("Cs", "Cc", "Zs", "Zl", "Zp"), blacklist_characters="'\""),
    min_size=1,
    max_size=30,
).filter(lambda p: not p.isspace() and p != MASK)


@settings(max_examples=300, deadline=None)
@given(
    user=hs.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True),
    pw=_PW,
    host=hs.from_regex(r"[a-z][a-z0-9.-]{0,15}", fullmatch=True),
    port=hs.integers(1, 65535),
    db=hs.from_regex(r"[a-z0-9_]{0,10}", fullmatch=True),
    before=hs.sampled_from(["", "error: ", "('", "argv: ['--storage', '"]),
)
def test_no_password_survives_in_any_url(user: str, pw: str, host: str, port: int, db: str, before: str) -> None:
    url = f"postgresql+psycopg://{user}:{pw}@{host}:{port}/{db}"
    end = "'" if before else ""
    out = redact(f"{before}{url}{end}")
    # exactly the password is gone: user, host, port and database stay for the reader
    assert out == f"{before}postgresql+psycopg://{user}:{MASK}@{host}:{port}/{db}{end}"
    assert redact(out) == out


@settings(max_examples=300, deadline=None)
@given(hs.text(max_size=80))
def test_redact_never_raises_and_is_idempotent(text: str) -> None:
    once = redact(text)
    assert isinstance(once, str) and redact(once) == once


def test_log_lines_are_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    tuner.log.info(f"study in {PG}")
    tuner.log.notice(f"resume from {PG}")
    tuner.log.warning(f"cannot reach {PG}")
    with tuner.log.step(f"open {PG}"):
        pass
    err = capsys.readouterr().err
    assert "s3cr3t-pw" not in err and err.count(":***@db.example") == 4


def test_crash_log_with_a_password_in_argv(
    isolated_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A crash of `tuner search --storage postgresql://user:secret@...`: neither the paragraph on the
    screen nor the crash log (command, argv, environment, traceback) holds the password."""

    def boom(*a: object, **k: object) -> None:
        raise RuntimeError(f"could not talk to {PG}")

    monkeypatch.delenv("TUNER_DEBUG", raising=False)
    monkeypatch.setenv("TUNER_STORAGE_HINT", PG)  # a TUNER_* variable is copied into the log
    monkeypatch.setattr(tuner.log, "table", boom)
    monkeypatch.setattr(sys, "argv", ["tuner", "archs", "--storage-note", PG])  # any argument may hold it
    argv = ["archs", "--storage", PG]
    code = crash.report_crash(RuntimeError(f"could not talk to {PG}"), argv)
    err = capsys.readouterr().err
    assert code == 70 and "s3cr3t-pw" not in err and "tuner:***@db.example" in err
    log_file = Path(re.search(r"are in (\S+\.log)", err).group(1))
    text = log_file.read_text()
    assert "s3cr3t-pw" not in text
    assert "command:   tuner archs --storage 'postgresql+psycopg://tuner:***@db.example:5433/optuna'" in text
    assert "argv:      ['archs', '--storage', 'postgresql+psycopg://tuner:***@db.example:5433/optuna']" in text
    assert "TUNER_STORAGE_HINT=postgresql+psycopg://tuner:***@" in text and "RuntimeError: could not talk to" in text
    # through the CLI's own crash path too (--debug prints the traceback: redacted as well)
    monkeypatch.setenv("TUNER_DEBUG", "1")
    monkeypatch.setattr(sys, "argv", ["tuner", "archs"])
    with pytest.raises(SystemExit):
        main()
    err = capsys.readouterr().err
    assert "Traceback" in err and "s3cr3t-pw" not in err and "tuner:***@db.example" in err
    assert not [p for p in (isolated_home / "logs").glob("crash-*.log") if "s3cr3t-pw" in p.read_text()]


def test_an_error_message_is_redacted_on_its_way_to_the_screen(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Whatever module raised a TunerError naming the storage, main() prints it without the password."""
    from tuner import cli
    from tuner.errors import TunerError

    def fail(*a: object, **k: object) -> None:
        raise TunerError(f"the study at {PG} is locked")

    monkeypatch.setattr(cli.cli, "main", fail)
    with pytest.raises(SystemExit) as e:
        cli.main()
    err = capsys.readouterr().err
    assert e.value.code == 1 and "s3cr3t-pw" not in err and "tuner:***@db.example" in err
