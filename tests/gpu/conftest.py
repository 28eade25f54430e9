"""Every test in tests/gpu needs CUDA: marked `gpu` and skipped without a device, written once
here instead of in each module."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

GPU_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The hook sees the whole session's items: mark only the ones collected from this folder.
    skip = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
    for item in items:
        if GPU_DIR in item.path.parents:
            item.add_marker(pytest.mark.gpu)
            item.add_marker(skip)
