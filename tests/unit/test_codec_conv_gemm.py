"""The float32 GEMM form of the codec's k7 dilated convolutions (`decoder.conv7_gemm`): the same
convolution as F.conv1d, and a decoder using it decodes the same audio (CPU, float64)."""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

from support.codec_fixtures import random_codec_tensors

from higgs_serve.codec.codec_config import CodecConfig
from higgs_serve.codec.decoder import GEMM_CONV_MIN_CHANNELS, CodecDecoder, conv7_gemm


@pytest.mark.parametrize("dilation", [1, 3, 9])
@pytest.mark.parametrize("length", [1, 5, 40])
def test_conv7_gemm_is_the_same_convolution(dilation, length):
    g = torch.Generator().manual_seed(dilation * 100 + length)
    x = torch.randn(3, 6, length, generator=g, dtype=torch.float64)
    weight = torch.randn(4, 6, 7, generator=g, dtype=torch.float64)
    bias = torch.randn(4, generator=g, dtype=torch.float64)
    want = F.conv1d(x, weight, bias, padding=3 * dilation, dilation=dilation)
    torch.testing.assert_close(conv7_gemm(x, weight, bias, dilation), want, rtol=0, atol=1e-12)


def test_a_decoder_on_gemm_convs_decodes_the_same_audio():
    cfg = CodecConfig.tiny()
    dec = CodecDecoder(cfg)
    dec.load_state(random_codec_tensors(cfg, seed=3))
    dec = dec.double().eval()
    assert dec.gemm_conv_min_channels is None  # only float32 on CUDA picks the GEMM form
    codes = torch.randint(0, cfg.codebook_size, (2, 9, cfg.num_quantizers), generator=torch.Generator().manual_seed(0))
    cudnn = dec(codes, (2, 7))
    dec.gemm_conv_min_channels = 1  # every residual unit's k7 conv as a GEMM
    torch.testing.assert_close(dec(codes, (2, 7)), cudnn, rtol=0, atol=1e-12 * float(cudnn.abs().max()))


def test_the_real_geometry_uses_the_gemm_form_for_its_two_widest_stages():
    widths = [CodecConfig().decoder_hidden_size // 2 ** (i + 1) for i in range(5)]  # 512, 256, 128, 64, 32
    assert [w >= GEMM_CONV_MIN_CHANNELS for w in widths] == [True, True, False, False, False]
