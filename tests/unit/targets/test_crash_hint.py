"""The hint a SIGSEGV of llama-bench gets on an AMX host (llama.cpp issue 20824)."""

from __future__ import annotations

import pytest

from tuner.targets import host


@pytest.mark.parametrize(
    ("rc", "cmd", "amx", "hinted"),
    [
        (-11, ["llama-bench", "-m", "m.gguf"], True, True),
        (-11, ["llama-bench", "-m", "m.gguf"], False, False),  # no AMX: no known cause to name
        (-11, ["llama-bench", "--repack", "0"], True, False),  # AMX buffers already off
        (1, ["llama-bench", "-m", "m.gguf"], True, False),  # an error exit, not a crash
    ],
)
def test_crash_hint(monkeypatch: pytest.MonkeyPatch, rc: int, cmd: list[str], amx: bool, hinted: bool) -> None:
    monkeypatch.setattr(host, "host_has_amx", lambda: amx)
    hint = host.crash_hint(rc, cmd)
    assert ("20824" in hint and "--repack 0" in hint) if hinted else hint == ""
