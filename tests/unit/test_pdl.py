"""Programmatic dependent launch switches and the skinny GEMM's prefetch size (pure arithmetic;
the kernels that use them are tested on CUDA in tests/gpu/test_pdl_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from higgs_serve.model import pdl
from higgs_serve.model.skinny_gemm import PREFETCH_BUDGET_BYTES, config_for, prefetch_bytes_per_row

SHAPES_4B = {"qkv": (6144, 2560), "o": (2560, 4096), "gate_up": (19456, 2560), "down": (2560, 9728)}


@pytest.fixture(autouse=True)
def _restore():
    yield
    pdl.set_enabled(None)


def test_never_on_a_cpu_even_when_forced():
    cpu = torch.device("cpu")
    assert not pdl.enabled(cpu)
    pdl.set_enabled(True)
    assert not pdl.enabled(cpu) and not pdl.prefetch_enabled(cpu)
    assert pdl.launch_args(cpu) == {"USE_PDL": False, "launch_pdl": False}


@pytest.mark.parametrize("name", sorted(SHAPES_4B))
@pytest.mark.parametrize("m", [1, 16])
def test_prefetch_is_aligned_inside_the_slice_and_within_budget(name, m):
    n, k = SHAPES_4B[name]
    cfg = config_for(m, n, k, num_sms=132)
    per_row = prefetch_bytes_per_row(cfg, n, k, element_size=2)
    assert per_row > 0 and per_row % 16 == 0
    assert per_row <= (k // cfg.split_k) * 2  # never past the program's own K slice
    assert per_row * n * cfg.split_k <= PREFETCH_BUDGET_BYTES


def test_a_small_gemm_prefetches_its_whole_slice():
    cfg = config_for(1, 256, 512, num_sms=132)
    assert prefetch_bytes_per_row(cfg, 256, 512, element_size=2) == (512 // cfg.split_k) * 2
