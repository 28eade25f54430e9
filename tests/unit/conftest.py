"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Small tensors: intra-op threads only add contention on a busy 2-core machine. Use it for a
    whole module with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def clip(tmp_path) -> Path:
    """A 1 s 180 Hz tone at 24 kHz: a reference clip for the CLI commands that clone."""
    path = tmp_path / "me.wav"
    t = np.arange(24000) / 24000
    sf.write(path, (0.3 * np.sin(2 * np.pi * 180 * t)).astype(np.float32), 24000)
    return path
