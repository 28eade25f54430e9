"""The residual-unit convolutions on CUDA (codec/conv.py): the tensor-core kernel at tf32x3 is as
close to the float64 math as cuDNN's float32 convolution, per conv and through the whole decoder
at the real geometry; with torch's TF32 switch on it runs one TF32 MMA (as cuDNN does) and is
visibly less exact. Skipped without CUDA."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "parity"))
from codec_fixtures import random_codec_tensors  # noqa: E402
from conv_checks import SHAPES, check_conv  # noqa: E402

from higgs_serve.codec import conv  # noqa: E402
from higgs_serve.codec.codec_config import CodecConfig  # noqa: E402
from higgs_serve.codec.decoder import CodecDecoder  # noqa: E402


@pytest.fixture
def tf32_switch():
    old = torch.backends.cudnn.allow_tf32
    yield lambda on: setattr(torch.backends.cudnn, "allow_tf32", on)
    torch.backends.cudnn.allow_tf32 = old
    conv.set_backend(None)


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_conv_matches_float64_at_float32_precision(shape, residual, tf32_switch):
    tf32_switch(False)
    check_conv(shape, "cuda", residual, rtol=2e-6)


def test_tf32_switch_selects_one_mma(tf32_switch):
    tf32_switch(True)
    check_conv(SHAPES[3], "cuda", True, rtol=2e-3)
    with pytest.raises(AssertionError):  # one TF32 MMA is not float32-exact
        check_conv(SHAPES[3], "cuda", True, rtol=2e-6)


def test_decoder_real_geometry_as_exact_as_cudnn_float32(tf32_switch):
    tf32_switch(False)
    cfg = CodecConfig()
    tensors = random_codec_tensors(cfg, seed=2)
    codes = torch.randint(0, cfg.codebook_size, (3, 39, cfg.num_quantizers),
                          generator=torch.Generator().manual_seed(0)).cuda()
    ref_dec = CodecDecoder(cfg).eval()
    ref_dec.load_state(tensors)
    reference = ref_dec.to(device="cuda", dtype=torch.float64)(codes)
    errors = {}
    for backend in conv.BACKENDS:
        conv.set_backend(backend)
        dec = CodecDecoder(cfg).eval()
        dec.load_state(tensors)
        dec = dec.to("cuda")
        assert (dec.conv is conv.conv1d_fast) == (backend == "triton")
        errors[backend] = (dec(codes).double() - reference).abs().max().item()
    peak = reference.abs().max().item()
    print(f"\nmax |decode - float64| at peak {peak:.3f}: " + ", ".join(f"{k} {v:.2e}" for k, v in errors.items()))
    assert errors["triton"] <= 2 * errors["cudnn"] + 1e-7 * peak
