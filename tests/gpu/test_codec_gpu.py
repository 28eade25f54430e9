"""Codec on CUDA: default (real) geometry with random weights, CUDA vs CPU; an encode -> decode
round trip with timings; our resampler vs real torchaudio (where it loads). Skipped without CUDA."""

from __future__ import annotations

import math
import time

import pytest
import torch

from support.codec_fixtures import random_codec_tensors

from higgs_serve.codec.codec_config import CodecConfig
from higgs_serve.codec.decoder import CodecDecoder
from higgs_serve.codec.encoder import CodecEncoder
from higgs_serve.codec.resample import resample


@pytest.fixture(scope="module")
def default_tensors():
    return random_codec_tensors(CodecConfig(), seed=1)


def _timed(fn, *args, reps: int = 3):
    fn(*args)  # warm-up (cuDNN plan selection)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        out = fn(*args)
    torch.cuda.synchronize()
    return out, (time.perf_counter() - t) / reps


@pytest.mark.parametrize("tf32", [False, True], ids=["fp32", "tf32"])
def test_decode_cuda_matches_cpu_default_geometry(default_tensors, tf32):
    cfg = CodecConfig()
    dec = CodecDecoder(cfg).eval()
    dec.load_state(default_tensors)
    codes = torch.randint(0, 1024, (2, 25, 8), generator=torch.Generator().manual_seed(0))
    cpu = dec(codes)
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = tf32
    try:
        gpu, secs = _timed(dec.to("cuda"), codes.cuda())
    finally:
        torch.backends.cudnn.allow_tf32 = old
    diff = (gpu.cpu() - cpu).abs().max().item()
    scale = cpu.abs().max().item()
    print(f"\ndecode [2, 25, 8] default geometry, cudnn tf32={tf32}: {secs * 1e3:.1f} ms; "
          f"max |cuda - cpu| = {diff:.2e} (peak {scale:.2f})")
    assert gpu.shape == (2, 25 * 960)
    assert diff <= (5e-2 if tf32 else 1e-3) * max(scale, 1.0)


def test_encode_decode_round_trip_default_geometry(default_tensors):
    cfg = CodecConfig()
    enc = CodecEncoder(cfg).eval().cuda()
    dec = CodecDecoder(cfg).eval().cuda()
    enc.load_state(default_tensors)
    dec.load_state(default_tensors)
    t = torch.arange(3 * 24000) / 24000
    audio = (0.3 * torch.sin(2 * math.pi * 200 * t) + 0.05 * torch.randn(t.shape)).cuda()
    codes, enc_s = _timed(enc.encode, audio)
    wav, dec_s = _timed(dec, codes[None])
    print(f"\n3 s reference, default geometry on CUDA: encode {enc_s * 1e3:.1f} ms, decode {dec_s * 1e3:.1f} ms")
    assert codes.shape == (75, 8) and codes.dtype == torch.int64
    assert int(codes.min()) >= 0 and int(codes.max()) < 1024
    assert wav.shape == (1, 75 * 960) and torch.isfinite(wav).all()
    cpu_codes = CodecEncoder(cfg).eval()
    cpu_codes.load_state(default_tensors)
    agree = (cpu_codes.encode(audio.cpu()) == codes.cpu()).float().mean().item()
    print(f"encode codes CUDA vs CPU agreement: {agree:.3f}")
    assert agree >= 0.9  # RVQ argmin may flip on near ties between fp32 backends


def _real_torchaudio():
    from support.hf_reference import torchaudio_is_real

    if not torchaudio_is_real():
        pytest.skip("real torchaudio cannot be imported here")
    import torchaudio.functional as taf

    return taf


# fp32 tolerances: torchaudio builds its filter in the input dtype, we build it in float64, so for
# 147:80 (44.1k -> 24k) torchaudio's own float32 filter is the less accurate one (worst on CUDA).
@pytest.mark.parametrize("orig, new, tol", [(24000, 16000, 2e-6), (16000, 24000, 2e-6), (48000, 24000, 2e-6),
                                            (44100, 24000, 2e-3)])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_resample_matches_real_torchaudio(orig, new, tol, device):
    taf = _real_torchaudio()
    x = torch.randn(2, orig + 137, generator=torch.Generator().manual_seed(orig)).to(device)
    ours = resample(x, orig, new)
    theirs = taf.resample(x, orig, new)
    assert ours.shape == theirs.shape and ours.dtype == torch.float32
    assert (ours - theirs).abs().max().item() <= tol
    # in float64 both build the same filter exactly: the algorithm itself agrees to rounding
    exact = (resample(x.double(), orig, new) - taf.resample(x.double(), orig, new)).abs().max().item()
    assert exact <= 1e-10, exact


def test_encoder_parity_with_real_torchaudio_reference():
    """Where real torchaudio loads, the transformers reference uses it: codes must still match."""
    _real_torchaudio()
    try:
        from codec_fixtures import tiny_codec

        codec = tiny_codec()
    except ImportError as err:  # transformers without the Higgs tokenizer
        pytest.skip(f"transformers reference unavailable: {err}")
    enc = CodecEncoder(codec.cfg).eval()
    enc.load_state(codec.tensors)
    g = torch.Generator().manual_seed(5)
    for n in (24000, 31200, 48000):
        audio = 0.3 * torch.randn(n, generator=g)
        with torch.no_grad():
            want = codec.reference.encode(audio[None, None], return_dict=False)[0].T
        assert torch.equal(enc.encode(audio), want)
