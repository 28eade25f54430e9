"""The tensor-core residual-unit convs (`codec/conv_split.py`) off the GPU: the weight split and
the decoder's choice run everywhere; the kernel's indexing, Snake prologue and skip epilogue run
through Triton's interpreter (tf32x3 only: the interpreter's bfloat16 dot is wrong on CPU) with
TRITON_INTERPRET=1 set before the run. tests/gpu/test_codec_conv_split_gpu.py runs both modes
compiled:

    TRITON_INTERPRET=1 PYTHONPATH=src python -m pytest -q tests/unit/test_conv_split.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conv_split_checks import CASES, check_conv  # noqa: E402

from higgs_serve.codec.codec_config import CodecConfig  # noqa: E402
from higgs_serve.codec.conv_split import LaunchShape, fits, tap_major  # noqa: E402
from higgs_serve.codec.decoder import CodecDecoder  # noqa: E402

interpreted = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="needs Triton with TRITON_INTERPRET=1 set before the run")


def test_bf16_split_weight_recovers_float32_to_2e16():
    w = torch.randn(64, 32, 7)
    b = torch.randn(64)
    tw = tap_major(w, b, "bf16x3")
    assert tw.hi.dtype == tw.lo.dtype == torch.bfloat16 and tw.hi.shape == (7, 64, 32)
    back = (tw.hi.float() + tw.lo.float()).permute(1, 2, 0)
    assert ((back - w).abs() <= 2.0**-16 * w.abs()).all()
    assert tw.taps == 7 and tw.channels == (32, 64)


def test_tf32x3_weight_is_the_float32_weight_tap_major():
    w = torch.randn(32, 32, 1)
    tw = tap_major(w, torch.zeros(32), "tf32x3")
    assert tw.hi.dtype == torch.float32 and torch.equal(tw.hi[0], w[:, :, 0])


def test_unknown_split_mode_is_refused():
    with pytest.raises(ValueError, match="tf32x3"):
        tap_major(torch.randn(32, 32, 7), torch.zeros(32), "fp16x2")


def test_only_tileable_widths_fit():
    assert fits(32, 32) and fits(64, 64) and fits(512, 512)
    assert not fits(16, 16) and not fits(48, 48)


def test_decoder_refuses_tensor_core_units_off_cuda():
    dec = CodecDecoder(CodecConfig())
    assert dec.unit_mode is None
    with pytest.raises(ValueError, match="float32 decoder on CUDA"):
        dec.set_unit_mode("tf32x3")
    assert dec.unit_mode is None


@interpreted
@pytest.mark.parametrize("fused", [False, True], ids=["plain", "snake+skip"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_interpreted_tf32x3_conv_matches_float64(case, fused):
    pytest.importorskip("triton")
    check_conv(case, "tf32x3", "cpu", fused, shape=LaunchShape(32, 32, 32, 4, 1))
