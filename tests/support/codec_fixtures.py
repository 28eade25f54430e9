"""Shared set-up for the codec parity tests: a randomised transformers reference on the tiny
geometry and the same weights as checkpoint-style codec tensors."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from support.hf_reference import build_reference, randomize_, reference_codec_tensors

from higgs_serve.codec.codec_config import CodecConfig
from higgs_serve.codec.weights import load_codec_tensors


@dataclass(frozen=True)
class TinyCodec:
    cfg: CodecConfig
    reference: torch.nn.Module  # transformers HiggsAudioV2TokenizerModel, eval, fp32, folded
    tensors: dict  # checked codec tensors (prefix-stripped, folded)


@lru_cache(maxsize=2)
def tiny_codec(seed: int = 0) -> TinyCodec:
    torch.manual_seed(seed)
    cfg = CodecConfig.tiny()
    reference = randomize_(build_reference(cfg.to_hf_dict()), seed=seed)
    tensors = load_codec_tensors(cfg, reference_codec_tensors(reference), where="tiny reference")
    return TinyCodec(cfg, reference, tensors)


def tiny_codec_module(module_cls: type[torch.nn.Module], seed: int = 0) -> tuple[TinyCodec, torch.nn.Module]:
    """The tiny reference codec and `module_cls(cfg)` (our CodecDecoder or CodecEncoder) in eval
    mode with the same weights."""
    codec = tiny_codec(seed)
    ours = module_cls(codec.cfg).eval()
    ours.load_state(codec.tensors)
    return codec, ours


def random_codec_tensors(cfg: CodecConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random, well-scaled tensors for every expected codec name (no transformers needed): snake
    alphas in [0.5, 1.5), norm weights near 1, small biases, weights ~ N(0, 1/fan_in) (x0.3 inside
    DAC residual units so the stacks do not grow the signal), codebooks ~ N(0, 1)."""
    from higgs_serve.codec.weights import expected_codec_tensors

    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in expected_codec_tensors(cfg).items():
        leaf = name.split(".")
        if name.endswith("alpha"):
            t = torch.rand(shape, generator=g) + 0.5
        elif name.endswith("codebook.embed"):
            t = torch.randn(shape, generator=g)
        elif "norm" in leaf[-2] and leaf[-1] == "weight":
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)
        elif len(shape) == 1:
            t = 0.1 * torch.randn(shape, generator=g)
        else:
            fan_in = shape[0] * shape[2] // 2 if name.endswith("conv_t1.weight") else int(torch.tensor(shape[1:]).prod())
            gain = 0.3 if "res_unit" in name else 1.0
            t = gain * torch.randn(shape, generator=g) / fan_in**0.5
        out[name] = t
    return out
