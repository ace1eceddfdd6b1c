"""A real build carried between two machines (two TUNER_HOMEs): `tuner build --pack` where it was built,
`tuner source unpack` and `tuner build --from-pack` where it runs, then the commands that ask for the
variant take it as built, and fa-bench compiles against its headers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner import _run

pytestmark = pytest.mark.integration

TARGETS = "llama-bench,test-backend-ops,llama-quantize"


def test_cpu_build_carried_to_another_home_runs_without_compiling(
    cpu_build, tuner_home: Path, tuner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pack, src_pack = tmp_path / "cpu-build.tar.xz", tmp_path / "src.tgz"
    out = tuner("build", "--arch", "cpu", "--targets", TARGETS, "--pack", str(pack), home=tuner_home)
    assert "cached" in out.stdout and pack.is_file()
    tuner("source", "pack", "-o", str(src_pack), home=tuner_home)

    there = tmp_path / "gpu-machine"
    tuner("source", "unpack", str(src_pack), home=there)
    out = tuner("build", "--arch", "cpu", "--targets", TARGETS, "--from-pack", str(pack), home=there)
    assert "carried (cpu-build.tar.xz" in out.stdout
    # artifacts/<candidate> is a link to the current numbered folder (<candidate>.vN), whose number is each
    # home's own: the carried build is found through the link
    version = Path(cpu_build.bin_dir).parent.relative_to(tuner_home)
    bin_dir = there / version.with_name(version.name.rpartition(".v")[0]) / "bin"
    rec = json.loads((bin_dir.parent / "build.json").read_text())
    assert rec["carried"]["pack"] == "cpu-build.tar.xz" and rec["build_id"] == cpu_build.build_id
    # the same command without the pack now finds the carried build: nothing configured or compiled here
    out = tuner("build", "--arch", "cpu", "--targets", TARGETS, home=there)
    assert "carried (cpu-build.tar.xz" in out.stdout
    assert not (bin_dir.parents[2] / "build").exists()
    assert "Available devices" in _run.run([bin_dir / "llama-bench", "--list-devices"], timeout=60).output

    # tuner's own benchmark compiles against the carried headers and libraries
    from tuner.measure.fa_bench import build_fa_bench

    monkeypatch.setenv("TUNER_HOME", str(there))
    exe = build_fa_bench(bin_dir)
    assert exe.is_relative_to(there) and exe.is_file()

    # a pack asked to stand for another variant is refused before anything is written
    out = tuner(
        "build", "--arch", "cpu", "--variant", "cpu-no-native", "--from-pack", str(pack), home=there, check=False
    )
    assert out.returncode == 2 and "is not a build of" in out.stderr, out.stderr
