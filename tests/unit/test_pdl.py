"""Programmatic dependent launch switches (the kernels that use them are tested on CUDA in
tests/gpu/test_pdl_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from higgs_serve.kernels import pdl


@pytest.fixture(autouse=True)
def _restore():
    yield
    pdl.set_enabled(None)


def test_never_on_a_cpu_even_when_forced():
    cpu = torch.device("cpu")
    assert not pdl.enabled(cpu)
    pdl.set_enabled(True)
    assert not pdl.enabled(cpu)
    assert pdl.launch_args(cpu) == {"USE_PDL": False, "launch_pdl": False}
