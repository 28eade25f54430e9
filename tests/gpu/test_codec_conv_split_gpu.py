"""On CUDA: the tensor-core residual-unit convs (`codec/conv_split.py`), compiled, in both split
modes: each conv form against float64, and the whole decoder with its units on the tensor cores
against a float64 decode, eager and replayed from a CUDA graph (skipped without CUDA)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "parity"))
from codec_fixtures import random_codec_tensors  # noqa: E402
from conv_split_checks import CASES, check_conv  # noqa: E402

from higgs_serve.codec.codec_config import CodecConfig  # noqa: E402
from higgs_serve.codec.conv_split import MODES  # noqa: E402
from higgs_serve.codec.decoder import CodecDecoder  # noqa: E402

# max |error| / peak of a whole real-geometry decode against float64 (cuDNN float32: ~3.5e-6)
DECODER_TOLERANCE = {"tf32x3": 1e-5, "bf16x3": 1e-4}


@pytest.fixture(autouse=True)
def _float32_convs():
    """cuDNN's TF32 switch (on by default) must not leak into the references or the torch form."""
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = saved


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fused", [False, True], ids=["plain", "snake+skip"])
@pytest.mark.parametrize("case", CASES + [(512, 7, 3, 300), (256, 1, 1, 77)], ids=str)
def test_conv_matches_float64(case, mode, fused):
    check_conv(case, mode, "cuda", fused)


def _decoders(mode):
    cfg = CodecConfig()
    tensors = random_codec_tensors(cfg, seed=3)
    ref = CodecDecoder(cfg).to(device="cuda", dtype=torch.float64).eval()
    ref.load_state({k: v.double() for k, v in tensors.items()})
    dec = CodecDecoder(cfg).to("cuda").eval()
    dec.load_state(tensors)
    dec.set_unit_mode(mode)
    return ref, dec


@pytest.mark.parametrize("mode", MODES)
def test_decoder_with_tensor_core_units_matches_float64(mode):
    ref, dec = _decoders(mode)
    assert len(dec._units) == 15  # every residual unit of the real geometry fits
    codes = torch.randint(0, 1024, (3, 39, 8), generator=torch.Generator().manual_seed(0)).cuda()
    for keep in ((0, 39), (10, 35)):
        expected = ref(codes, keep)
        err = ((dec(codes, keep).double() - expected).abs().max() / expected.abs().max()).item()
        print(f"\n{mode} keep {keep}: max error {err:.2e} of peak")
        assert err <= DECODER_TOLERANCE[mode]


@pytest.mark.parametrize("mode", MODES)
def test_decoder_units_replay_from_a_cuda_graph(mode):
    _, dec = _decoders(mode)
    codes = torch.randint(0, 1024, (4, 12, 8), generator=torch.Generator().manual_seed(1)).cuda()
    eager = dec(codes, (2, 10))
    static = codes.clone()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        dec(static, (2, 10))  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = dec(static, (2, 10))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, eager, rtol=0, atol=0)


def test_moving_and_reloading_keeps_the_mode_and_resplits():
    cfg = CodecConfig()
    dec = CodecDecoder(cfg).to("cuda")
    dec.set_unit_mode("tf32x3")
    dec.load_state(random_codec_tensors(cfg, seed=4))
    unit = dec._units["acoustic_decoder.block.0.res_unit1"]
    w = dec._w()["acoustic_decoder.block.0.res_unit1.conv1.weight"]
    assert torch.equal(unit.conv1.hi, w.permute(2, 0, 1))  # split from the loaded weights
    dec.cpu()
    assert dec.unit_mode == "tf32x3" and dec._units == {}
    dec.cuda()
    assert len(dec._units) == 15
