"""Programmatic dependent launch switches (the kernels that use them are tested on CUDA in
tests/gpu/test_pdl_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from higgs_serve.model import pdl


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


def test_modes_map_to_the_kernels_constexpr(monkeypatch):
    gpu = torch.device("cuda")
    monkeypatch.setattr(pdl, "_supported", lambda device: device.type == "cuda")
    assert pdl.launch_args(gpu) == {"USE_PDL": pdl.MODES[pdl.DEFAULT_MODE], "launch_pdl": True}
    pdl.set_mode("early")
    assert pdl.launch_args(gpu) == {"USE_PDL": 2, "launch_pdl": True}
    pdl.set_enabled(False)
    assert pdl.launch_args(gpu) == {"USE_PDL": 0, "launch_pdl": False} and not pdl.enabled(gpu)
    pdl.set_enabled(True)
    assert pdl.level(gpu) == pdl.MODES[pdl.DEFAULT_MODE]
    with pytest.raises(KeyError):
        pdl.set_mode("sometimes")
