"""The codec's "bf16x3" precision (`codec/split_conv.py`): float32 operands split into bf16 hi + lo
parts, convolutions as one GEMM over [hi; lo; hi] against [w_hi | w_hi | w_lo]. On CPU the GEMM's
products are summed in float32 math (cuBLAS does the same on CUDA, in another order), so the
arithmetic of the split form is checked here against float64; tests/gpu runs it on cuBLAS."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from support.codec_fixtures import random_codec_tensors
from support.split_conv_checks import check_conv_split, randn

from higgs_serve.codec.codec_config import CodecConfig
from higgs_serve.codec.decoder import PRECISION_DTYPES, CodecDecoder
from higgs_serve.codec.snake import snake, snake_split
from higgs_serve.codec.split_conv import matmul_f32, split_bf16, split_weight, taps
from higgs_serve.config.deploy import CODEC_DTYPES


def test_hi_plus_lo_is_the_float32_value_to_2_to_the_minus_16():
    x = 10 * randn(10_000, seed=0)
    hi, lo = split_bf16(x)
    assert hi.dtype == lo.dtype == torch.bfloat16
    err = (hi.double() + lo.double() - x.double()).abs()
    assert float((err / x.double().abs()).max()) <= 2.0**-16
    assert float((hi.double() - x.double()).abs().max() / x.abs().max()) > 1e-4  # hi alone is bf16-coarse


def test_split_weight_lays_out_hi_hi_lo_in_tap_order():
    w = randn(4, 3, 7, seed=1)
    got = split_weight(w)
    hi, lo = split_bf16(w.reshape(4, 21))
    assert got.shape == (4, 63) and got.dtype == torch.bfloat16
    assert torch.equal(got[:, :21], hi) and torch.equal(got[:, 21:42], hi) and torch.equal(got[:, 42:], lo)


def test_the_split_snake_writes_hi_lo_hi_blocks_of_the_biased_snake():
    x, alpha, bias = randn(2, 5, 11, seed=2), randn(1, 5, 1, seed=3).abs() + 0.5, randn(5, seed=4)
    got = snake_split(x, alpha, bias)
    want = snake(x + bias[:, None], alpha)
    assert got.shape == (2, 15, 11) and got.dtype == torch.bfloat16
    assert torch.equal(got[:, :5], got[:, 10:])
    torch.testing.assert_close(got[:, :5].float() + got[:, 5:10].float(), want, rtol=2.0**-16, atol=1e-7)


@pytest.mark.parametrize("dilation", [1, 3, 9])
@pytest.mark.parametrize("length", [1, 6, 40])
def test_split_k7_conv_is_the_convolution_to_2_to_the_minus_15_of_its_terms(dilation, length):
    """Each output is off by at most 2^-15 of Σ|w·x| (the dropped lo·lo products are ~2^-16 of
    each term, float32 sums add less): float32-class, where TF32 would be ~2^-11."""
    x, w = randn(3, 8, length, seed=dilation), randn(6, 8, 7, seed=length) / 8
    hi, lo = split_bf16(x)
    got = matmul_f32(split_weight(w), taps(torch.cat([hi, lo, hi], dim=1), dilation))
    conv = dict(padding=3 * dilation, dilation=dilation)
    want = F.conv1d(x.double(), w.double(), **conv)
    terms = F.conv1d(x.double().abs(), w.double().abs(), **conv)
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert bool(((got.double() - want).abs() <= 2.0**-15 * terms).all())


def _decoders(seed: int = 1) -> tuple[CodecDecoder, CodecDecoder, CodecDecoder]:
    cfg = CodecConfig.tiny()
    tensors = random_codec_tensors(cfg, seed=seed)
    ref = CodecDecoder(cfg)
    ref.load_state(tensors)
    split = CodecDecoder(cfg).use_precision("bf16x3")
    split.load_state(tensors)
    plain = CodecDecoder(cfg)
    plain.load_state(tensors)
    return ref.double().eval(), split.eval(), plain.eval()


def test_a_bf16x3_decoder_decodes_the_float64_audio_to_1e_5_of_peak():
    ref, split, plain = _decoders()
    assert split.split_units is not None and plain.split_units is None
    codes = torch.randint(0, 1024, (2, 9, 8), generator=torch.Generator().manual_seed(0))
    want = ref(codes, (2, 7))
    got = split(codes, (2, 7))
    peak = float(want.abs().max())
    err = float((got.double() - want).abs().max())
    assert got.dtype == torch.float32
    assert err <= 1e-5 * peak
    assert err > float((plain(codes, (2, 7)).double() - want).abs().max())  # it took the split path


def test_split_weights_follow_a_reload():
    _, split, _ = _decoders()
    before = split.split_units["acoustic_decoder.block.0.res_unit1"].conv7.flat.clone()
    split.load_state(random_codec_tensors(CodecConfig.tiny(), seed=7))
    assert not torch.equal(split.split_units["acoustic_decoder.block.0.res_unit1"].conv7.flat, before)


def test_precisions_are_checked_against_the_weights():
    dec = CodecDecoder(CodecConfig.tiny())
    with pytest.raises(ValueError, match="codec precision must be one of"):
        dec.use_precision("fp32x3")
    with pytest.raises(ValueError, match="needs torch.float32 weights"):
        dec.to(torch.bfloat16).use_precision("bf16x3")


def test_every_deploy_codec_dtype_is_a_decoder_precision():
    assert set(CODEC_DTYPES) == set(PRECISION_DTYPES)


def test_bf16x3_splits_only_units_of_at_least_split_conv_min_channels(monkeypatch):
    import higgs_serve.codec.decoder as decoder

    ref, split, _ = _decoders()
    widths = []
    real = decoder.split_residual_unit
    monkeypatch.setattr(decoder, "split_residual_unit", lambda x, *a: widths.append(x.shape[1]) or real(x, *a))
    codes = torch.randint(0, 1024, (1, 6, 8), generator=torch.Generator().manual_seed(1))
    split.split_conv_min_channels = 8
    split(codes)
    assert widths and min(widths) >= 8
    assert len(widths) < 3 * len(split.cfg.upsampling_ratios)  # the narrow blocks stayed float32


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1 set before the run")
def test_interpreted_triton_split_conv_is_the_gemm_form():
    pytest.importorskip("triton")
    check_conv_split("cpu", torch.float32)
