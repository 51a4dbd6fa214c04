import os

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    """GPU tests skip (with the reason) when the hardware is absent."""
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    hopper = n > 0 and torch.cuda.get_device_capability(0)[0] == 9
    need = {"gpu": (n >= 1, "needs a CUDA GPU"), "gpu2": (n >= 2, "needs 2 GPUs"), "gpu8": (n >= 8, "needs 8 GPUs"),
            "hopper": (hopper, "needs an sm_90 (Hopper) GPU")}
    for item in items:
        for mark, (ok, why) in need.items():
            if mark in item.keywords and not ok:
                item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path
