"""The codec decoder's receptive field: the analytic walk in `receptive_field_frames` equals what
perturbing one frame actually reaches (tiny geometry, float64, random weights), and it is what
lets the `full_and_piecewise` profile cut its streaming left context to 10 frames."""

from __future__ import annotations


import torch

from support.codec_fixtures import random_codec_tensors

from higgs_serve.codec.codec_config import CodecConfig
from higgs_serve.codec.decoder import CodecDecoder, receptive_field_frames
from higgs_serve.config.loader import load_deploy_config


def _reach(cfg: CodecConfig, frames: int, probe: int) -> tuple[int, int]:
    """Frames whose audio moves at all when frame `probe`'s codes change: (before, after) it."""
    dec = CodecDecoder(cfg)
    dec.load_state(random_codec_tensors(cfg, seed=2))
    dec = dec.double().eval()
    codes = torch.randint(0, cfg.codebook_size, (1, frames, cfg.num_quantizers), generator=torch.Generator().manual_seed(0))
    moved = codes.clone()
    moved[0, probe] = (moved[0, probe] + cfg.codebook_size // 2) % cfg.codebook_size
    with torch.no_grad():
        diff = (dec(moved) - dec(codes)).abs().reshape(frames, cfg.hop_length).amax(1)
    touched = torch.nonzero(diff > 1e-12 * diff.max()).flatten()
    return probe - int(touched.min()), int(touched.max()) - probe


def test_analytic_receptive_field_is_what_a_perturbation_reaches():
    cfg = CodecConfig.tiny()
    assert receptive_field_frames(cfg) == _reach(cfg, frames=40, probe=20) == (10, 10)


def test_the_real_geometry_reaches_ten_frames_each_way():
    # measured on the 4B codec geometry with random weights in float64: frames 15-35 move for probe 25
    assert receptive_field_frames(CodecConfig()) == (10, 10)


def test_full_and_piecewise_left_context_is_exactly_the_receptive_field():
    deploy = load_deploy_config("higgs_multimodal_qwen3_full_and_piecewise", "higgs_multimodal_qwen3")
    window = deploy.streaming
    assert window.codec_left_context_frames == receptive_field_frames(CodecConfig())[0]
