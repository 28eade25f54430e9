"""Shared set-up for the codec parity tests: a randomised transformers reference on the tiny
geometry and the same weights as checkpoint-style codec tensors."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.hf_reference import build_reference, randomize_, reference_codec_tensors  # noqa: E402

from higgs_serve.codec.codec_config import CodecConfig  # noqa: E402
from higgs_serve.codec.weights import load_codec_tensors  # noqa: E402


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
