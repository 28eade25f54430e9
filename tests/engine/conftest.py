"""Fixtures of the engine acceptance tests; the helpers themselves are in engine_harness.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_harness import CPU, ManualEngine, engine_deploy

from higgs_serve.engine.builder import LoadedModel, load_model


@pytest.fixture(scope="session")
def tiny_loaded(tiny_model_dir: Path) -> LoadedModel:
    """The tiny checkpoint loaded once for every engine test (read-only: never mutate it)."""
    return load_model(str(tiny_model_dir), CPU)


@pytest.fixture(scope="module")
def default_engine(tiny_loaded: LoadedModel) -> Iterator[ManualEngine]:
    """One per module: the default profile with 4 slots (default window and token budget)."""
    eng = ManualEngine(tiny_loaded, engine_deploy(max_num_seqs=4))
    yield eng
    eng.close()
