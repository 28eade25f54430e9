"""Fixtures of the engine acceptance tests; the helpers themselves are in engine_harness.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_harness import CPU

from higgs_serve.engine.builder import LoadedModel, load_model


@pytest.fixture(scope="session")
def tiny_loaded(tiny_model_dir: Path) -> LoadedModel:
    """The tiny checkpoint loaded once for every engine test (read-only: never mutate it)."""
    return load_model(str(tiny_model_dir), CPU)
