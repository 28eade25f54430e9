"""The skinny GEMM's launch-shape choice (pure arithmetic; the kernel itself is tested on CUDA in
tests/gpu/test_skinny_gemm.py)."""

from __future__ import annotations

import pytest

from higgs_serve.model.skinny_gemm import (MAX_ROWS, SMALL_ROWS, TUNED, SkinnyConfig, config_for, default_config,
                                            row_block, swiglu_config)

# the four per-layer GEMMs of the 4B talker: (N, K)
SHAPES_4B = {"qkv": (6144, 2560), "o": (2560, 4096), "gate_up": (19456, 2560), "down": (2560, 9728)}


@pytest.mark.parametrize("m,block", [(1, 16), (15, 16), (16, 16), (17, 32), (32, 32), (33, 64), (64, 64)])
def test_row_block_is_the_next_power_of_two_from_16(m, block):
    assert row_block(m) == block


@pytest.mark.parametrize("name", sorted(SHAPES_4B))
@pytest.mark.parametrize("m", [1, 7, 16])
def test_every_4b_decode_gemm_gets_a_fitting_config_with_enough_programs(name, m):
    n, k = SHAPES_4B[name]
    cfg = config_for(m, n, k, num_sms=132)
    assert cfg is not None and cfg.fits(n, k)
    assert (n // cfg.block_n) * cfg.split_k >= 132  # at least one program per SM streams weights


@pytest.mark.parametrize("m", [17, 32, 33, 48, 64])
def test_past_16_rows_only_measured_buckets_use_the_kernel(m):
    for name in ("qkv", "o", "gate_up", "down"):
        n, k = SHAPES_4B[name]
        cfg = config_for(m, n, k, num_sms=132)
        bucket = min(max_m for max_m, _ in TUNED[(n, k)] if max_m >= m)
        assert cfg == dict(TUNED[(n, k)])[bucket] and cfg.fits(n, k)
        assert (n // cfg.block_n) * cfg.split_k >= 132
    assert config_for(m, 4096, 4096, num_sms=132) is None  # no bucket measured: no first-principles guess
    assert config_for(SMALL_ROWS, 4096, 4096, num_sms=132) is not None


def test_gate_up_buckets_take_the_swiglu_epilogue():
    n, k = SHAPES_4B["gate_up"]
    for m in (1, 16, 17, 64):
        cfg = config_for(m, n, k, num_sms=132)
        assert swiglu_config(cfg, n, k) == cfg


def test_no_config_past_max_rows_or_for_shapes_the_kernel_does_not_divide():
    assert config_for(MAX_ROWS + 1, 2560, 4096, 132) is None
    assert config_for(0, 2560, 4096, 132) is None
    assert config_for(1, 100, 4096, 132) is None  # N not a multiple of any block
    assert config_for(1, 2560, 100, 132) is None  # K not a multiple of the K block
    assert default_config(1, 32, 64, 132) is None  # N below one tile: cuBLAS


@pytest.mark.parametrize("m", [1, 16, 33, 64])
def test_the_first_principles_config_fits_every_4b_shape_at_any_row_count(m):
    for n, k in SHAPES_4B.values():
        cfg = default_config(m, n, k, num_sms=132)
        assert cfg is not None and cfg.fits(n, k) and (n // cfg.block_n) * cfg.split_k >= 132


def test_split_keeps_k_divisible():
    cfg = default_config(1, 2560, 9728, 132)  # 9728 = 2^9 * 19
    assert cfg is not None and 9728 % (cfg.split_k * cfg.block_k) == 0
    assert SkinnyConfig(64, 128, 3).fits(2560, 9728) is False


def test_swiglu_launch_shape_keeps_the_tile_and_needs_whole_sums():
    n, k = SHAPES_4B["gate_up"]
    cfg = config_for(1, n, k, num_sms=132)
    assert swiglu_config(cfg, n, k) == cfg  # the plain tile for gate rows, as many up rows
    assert swiglu_config(SkinnyConfig(64, 128, 4), n, k) is None  # split K: the activation needs whole sums
    assert swiglu_config(SkinnyConfig(64, 128, 1), 2 * 96, k) is None  # 96 gate rows: no whole tiles
    assert swiglu_config(None, n, k) is None
