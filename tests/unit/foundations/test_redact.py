"""Storage passwords never reach a screen, a log, a crash log or an export (tuner.redact)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

import tuner.errors
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


# ------------------------------------------------------------------ every form libpq takes a password in


@pytest.fixture
def no_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each case starts with no password remembered from an earlier one (the patterns alone must hold)."""
    import tuner.redact

    monkeypatch.setattr(tuner.redact, "_remembered", set())


@pytest.mark.usefixtures("no_remembered")
@pytest.mark.parametrize(
    ("value", "secret", "kept"),
    [
        ("postgresql://u:a bc@127.0.0.1:1/db", "a bc", "postgresql://u:***@127.0.0.1:1/db"),  # a space, not encoded
        ("postgresql://u:a%20b@h/db", "a%20b", "postgresql://u:***@h/db"),
        ("postgresql://u:p'q\"r@h/db", "p'q\"r", "postgresql://u:***@h/db"),  # quotes end nothing in one value
        ("postgres://u:x@y z/w@h:5432/db", "x@y z/w", "postgres://u:***@h:5432/db"),
        ("host=127.0.0.1 port=1 dbname=d password=secret1", "secret1", "host=127.0.0.1 port=1 dbname=d password=***"),
        ("host=h password='a bc' user=u", "a bc", "host=h password=*** user=u"),
        ("host=h password = 'it\\'s \\\\ ok' user=u", "it\\'s", "host=h password = *** user=u"),
        ("password=a\\ b host=h", "a\\ b", "password=*** host=h"),  # libpq's backslash-escaped space
        ("postgresql://h/db?sslmode=require&password=a%20b", "a%20b", "postgresql://h/db?sslmode=require&password=***"),
        ("postgresql://h/db?pass%77ord=secret2", "secret2", "postgresql://h/db?pass%77ord=***"),  # an encoded key
        ("postgresql://h/db?PASSWORD=secret3#x", "secret3", "postgresql://h/db?PASSWORD=***#x"),
    ],
)
def test_every_libpq_form_of_a_password_is_hidden(value: str, secret: str, kept: str) -> None:
    """A storage value as an argument, after --storage=, and in an error message once the check has seen it."""

    assert redact_argv(["search", "--storage", value]) == ["search", "--storage", kept]
    assert redact_argv([f"--storage={value}"]) == [f"--storage={kept}"]
    from tuner.redact import redact_value

    assert redact_value(value) == kept and redact_value(kept) == kept
    from tuner.redact import remember

    remember(value)  # what the storage check does first: the password is hidden in any text from then on
    for text in (f"--storage {value!r} is not a storage URL", f"error: {value}", f"({value!r},)"):
        assert secret not in redact(text), text


def test_a_bad_storage_value_is_refused_without_its_password(no_remembered: None) -> None:
    from tuner.study.storage import check_storage_url

    for value, secret in [
        ("postgresql://u:a b@127.0.0.1:1/db", "a b"),
        ("host=127.0.0.1 port=1 password=secret1", "secret1"),
        ("host=127.0.0.1 password='a b'", "a b"),
        ("postgresql://u:p'q@h:notaport/db", "p'q"),
    ]:
        with pytest.raises(tuner.errors.UsageError) as e:
            check_storage_url(value)
        msg = redact(str(e.value))  # what main() prints
        assert secret not in msg and "***" in msg, msg


@pytest.mark.parametrize("cmd", ["search", "worker", "export"])
@pytest.mark.parametrize(
    ("value", "secret"),
    [
        ("postgresql+psycopg://u:a b@127.0.0.1:1/db", "a b"),
        ("postgresql+psycopg://u:a%20b@127.0.0.1:1/db", "a%20b"),
        ("host=127.0.0.1 port=1 password=secret1", "secret1"),
        ("host=127.0.0.1 password='a b'", "'a b'"),
    ],
)
def test_search_worker_and_export_print_and_log_no_password(
    cmd: str,
    value: str,
    secret: str,
    isolated_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The real commands, through main(): exit 2 with the storage named, and no crash log holding it."""
    monkeypatch.delenv("TUNER_DEBUG", raising=False)
    monkeypatch.chdir(tmp_path)
    argv = ["tuner", cmd, "--storage", value, "--study", "s"]
    argv += ["-o", str(tmp_path / "out")] if cmd == "export" else ["--arch", "cpu", "--run-dir", str(tmp_path / "r")]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as e:
        main()
    err = capsys.readouterr().err
    assert e.value.code == 2 and "***" in err, err
    assert secret not in err and "internal error" not in err, err
    logs = isolated_home / "logs"
    assert not [p for p in logs.glob("crash-*.log")] if logs.is_dir() else True
    assert not (tmp_path / "out").exists() and not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("value", "secret"),
    [
        ("postgresql://u:a b c@h/db", "a b c"),
        ("host=h dbname=d password=secret1", "secret1"),
        ("host=h password='a b c' user=u", "a b c"),
    ],
)
def test_a_crash_log_holds_no_password_of_any_form(
    value: str, secret: str, isolated_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The crash paragraph and log of a command whose --storage is a spaced URL or a keyword string: its
    command line, argv and the traceback (whose message holds the value as the exception had it)."""
    monkeypatch.delenv("TUNER_DEBUG", raising=False)
    code = crash.report_crash(RuntimeError(f"cannot parse {value!r}"), ["export", "--storage", value])
    err = capsys.readouterr().err
    log_file = Path(re.search(r"are in (\S+\.log)", err).group(1))
    assert code == 70 and secret not in err and secret not in log_file.read_text()
    assert "***" in log_file.read_text().split("argv:", 1)[1].splitlines()[0]
