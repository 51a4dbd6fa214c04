"""NUMA binding helper: cpulist parsing, and a no-op (None) where sysfs says nothing."""
import pytest

from kosmos_bench.runtime import numa


def test_parse_cpulist():
    assert numa._parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert numa._parse_cpulist("") == set()


def test_bind_near_without_pci_info_is_none(monkeypatch):
    monkeypatch.setattr(numa, "pci_dir", lambda i: None)
    numa._BOUND.clear()
    assert numa.bind_near(0) is None


def test_bind_near_restricts_to_local_cpus(monkeypatch, tmp_path):
    import os

    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no sched_setaffinity on this platform")
    before = os.sched_getaffinity(0)
    cpu = min(before)
    (tmp_path / "local_cpulist").write_text(f"{cpu}\n")
    (tmp_path / "numa_node").write_text("1\n")
    monkeypatch.setattr(numa, "pci_dir", lambda i: tmp_path)
    numa._BOUND.clear()
    try:
        assert numa.bind_near(0) == 1 and os.sched_getaffinity(0) == {cpu}
        assert numa.bind_near(0) == 1  # once per device
    finally:
        os.sched_setaffinity(0, before)
        numa._BOUND.clear()
