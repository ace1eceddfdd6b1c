"""Pack the real pinned llama.cpp tree and unpack it into a fresh TUNER_HOME, the way a tree is carried
to a GPU machine: every check `tuner source unpack` makes (entries, source.json, tree_sha256, era)
passes on the real thing, and the SPEC resolves there without pip."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner import source as S

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("trim", [True, False])
def test_real_tree_round_trips(tree_a: S.Source, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trim: bool) -> None:
    pack = S.pack_source(tree_a, tmp_path / "carry.tgz", trim=trim)
    monkeypatch.setenv("TUNER_HOME", str(tmp_path / "gpu-machine"))
    got = S.unpack_source(pack)
    assert (got.spec, got.source_id, got.era, got.commit) == (tree_a.spec, tree_a.source_id, tree_a.era, tree_a.commit)
    assert S.unpack_source(pack).root == got.root  # unpacking again changes nothing
    monkeypatch.setattr("tuner.source.fetch.run_pip_download", lambda *a: pytest.fail("must not download"))
    again = S.fetch_source(tree_a.spec)
    assert again.cached and again.root == got.root
    assert (got.root / "ggml/src/ggml-cuda/fattn.cu").read_bytes() == (
        tree_a.root / "ggml/src/ggml-cuda/fattn.cu"
    ).read_bytes()
