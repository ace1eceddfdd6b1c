"""CPU masks (--cpu-mask), the CPUs a run may use, thread counts and the taskset pin."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.errors import UsageError
from tuner.targets import host
from tuner.targets.host import Cpus, check_threads, host_cpus, mask_text, parse_cpu_mask, pin_command

EIGHT = tuple(range(8))


@pytest.mark.parametrize(
    ("text", "ids"), [("0-3", (0, 1, 2, 3)), ("0,2", (0, 2)), (" 1 - 2 , 5", (1, 2, 5)), ("7", (7,)), ("3,1,3", (1, 3))]
)
def test_cpu_lists_parse(text: str, ids: tuple[int, ...]) -> None:
    assert parse_cpu_mask(text, available=EIGHT) == ids


@pytest.mark.parametrize("text", ["", "a", "0-", "-1", "0,,1", "0x3", "1.5", "3-1", "0-9999999999"])
def test_a_malformed_mask_is_one_paragraph_with_an_example(text: str) -> None:
    with pytest.raises(UsageError) as e:
        parse_cpu_mask(text, available=EIGHT)
    msg = str(e.value)
    assert e.value.exit_code == 2 and "\n" not in msg and "0-7" in msg  # names the CPUs there are
    assert "e.g." in msg


def test_a_mask_naming_absent_cpus_names_them_and_what_exists() -> None:
    with pytest.raises(UsageError) as e:
        parse_cpu_mask("6-9,12", available=EIGHT)
    assert "8-9,12" in str(e.value) and "0-7 (8 in all)" in str(e.value)
    with pytest.raises(UsageError, match="does not have"):
        parse_cpu_mask("2", available=(0, 1))


def test_mask_text_is_the_shortest_list() -> None:
    assert mask_text([0, 1, 2, 3, 6, 8, 9]) == "0-3,6,8-9"
    assert mask_text([5]) == "5" and mask_text([]) == ""


def _fake_sysfs(root: Path, cores: dict[int, int]) -> None:
    for cpu, core in cores.items():
        topo = root / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text("0\n")
        (topo / "core_id").write_text(f"{core}\n")


def test_physical_cores_count_smt_siblings_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_sysfs(tmp_path, {0: 0, 1: 1, 2: 0, 3: 1})  # 2 cores x 2 threads, siblings 0/2 and 1/3
    monkeypatch.setattr(host, "_SYS_CPU", tmp_path)
    assert host_cpus((0, 1, 2, 3)) == Cpus(ids=(0, 1, 2, 3), physical=2, masked=True)
    assert host_cpus((0, 2)).physical == 1  # a mask of one core's two threads
    assert host_cpus((0, 1)).physical == 2
    monkeypatch.setattr(host, "_available", lambda: (0, 1, 2, 3))
    c = host_cpus()
    assert not c.masked and c.logical == 4 and c.physical == 2


def test_without_sysfs_physical_cores_come_from_psutil(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import psutil

    monkeypatch.setattr(host, "_SYS_CPU", tmp_path / "absent")
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 16 if logical else 8)
    assert host_cpus((0, 1, 2, 3)).physical == 2 and host_cpus((0,)).physical == 1


def test_thread_counts_must_fit_the_cpus() -> None:
    two = Cpus(ids=(0, 1), physical=2, masked=False)
    assert check_threads("2", two) == 2 and check_threads(1, two) == 1
    for bad in ("0", "-1", "3", "x", "1.5", ""):
        with pytest.raises(UsageError) as e:
            check_threads(bad, two)
        assert "1..2" in str(e.value) and "this machine" in str(e.value)
    with pytest.raises(UsageError, match="--cpu-mask 3"):
        check_threads(2, Cpus(ids=(3,), physical=1, masked=True))


def test_pin_command(monkeypatch: pytest.MonkeyPatch) -> None:
    assert pin_command(None) == [] and pin_command(()) == []
    monkeypatch.setattr(host.shutil, "which", lambda name: "/usr/bin/taskset")
    assert pin_command((0, 1, 3)) == ["/usr/bin/taskset", "-c", "0-1,3"]
    monkeypatch.setattr(host.shutil, "which", lambda name: None)
    with pytest.raises(UsageError, match="util-linux"):
        pin_command((0,))
