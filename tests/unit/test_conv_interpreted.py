"""The residual-unit convolution kernel's indexing (taps, dilation, padding, tails, bias, skip
connection) on CPU through Triton's interpreter. Runs only where Triton is installed and the run
was started with TRITON_INTERPRET=1; CI has no Triton and skips. On CUDA,
tests/gpu/test_codec_conv_gpu.py runs the same checks compiled, at the tf32x3 precision:

    TRITON_INTERPRET=1 PYTHONPATH=src python -m pytest -q tests/unit/test_conv_interpreted.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="needs TRITON_INTERPRET=1 set before the run")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "parity"))
from codec_fixtures import random_codec_tensors  # noqa: E402
from conv_checks import SHAPES, check_conv  # noqa: E402

from higgs_serve.codec.codec_config import CodecConfig  # noqa: E402
from higgs_serve.codec.conv import conv1d_fast, fits  # noqa: E402
from higgs_serve.codec.decoder import CodecDecoder  # noqa: E402


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_interpreted_conv_matches_float64(shape, residual):
    check_conv(shape, "cpu", residual, rtol=1e-6)  # the interpreter's dot is a float32 numpy matmul


def test_decoder_with_interpreted_convs_matches_torch():
    # the tiny geometry's first block (32 channels) takes the kernel, the narrower blocks fall back
    cfg = CodecConfig.tiny()
    dec = CodecDecoder(cfg).eval()
    dec.load_state(random_codec_tensors(cfg, seed=1))
    codes = torch.randint(0, cfg.codebook_size, (2, 6, cfg.num_quantizers), generator=torch.Generator().manual_seed(0))
    reference = dec(codes)
    calls = []
    dec.conv = lambda x, w, *a, **k: (calls.append(fits(x, w)), conv1d_fast(x, w, *a, **k))[1]
    torch.testing.assert_close(dec(codes), reference, rtol=1e-5, atol=1e-5)
    assert any(calls) and not all(calls)
