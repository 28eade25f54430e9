"""Shared fixtures: a tiny checkpoint written once per session, and a dense reference attention."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from support.hf_reference import torchaudio_is_real

from higgs_serve.model.hf_config import ModelSpec, load_model_spec
from higgs_serve.model.tiny import write_tiny_model

# transformers decides once, when first imported, whether torchaudio is available; the Higgs codec
# reference needs it. Put the real library or the test stand-in in place before any test module
# imports transformers, so the outcome does not depend on which test file is collected first.
torchaudio_is_real()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A complete tiny checkpoint directory (seed 0). Treat it as read-only."""
    directory = tmp_path_factory.mktemp("tiny_model")
    write_tiny_model(directory, seed=0)
    return directory


@pytest.fixture(scope="session")
def tiny_spec(tiny_model_dir: Path) -> ModelSpec:
    return load_model_spec(tiny_model_dir)


class DenseCausalAttention:
    """Reference attention for ONE sequence with a contiguous KV cache (tests and offline use).

    Each call appends the new k/v of `layer_idx` and lets query i (absolute position past + i)
    attend to keys 0..past + i. Same numerics as transformers' eager attention (fp32 softmax).
    """

    def __init__(self) -> None:
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}

    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q [N, Hq, Dh], k/v [N, Hkv, Dh]
        past = self.k[layer_idx].shape[0] if layer_idx in self.k else 0
        self.k[layer_idx] = k if past == 0 else torch.cat([self.k[layer_idx], k])
        self.v[layer_idx] = v if past == 0 else torch.cat([self.v[layer_idx], v])
        keys, values = self.k[layer_idx], self.v[layer_idx]  # [T, Hkv, Dh]
        rep = q.shape[1] // keys.shape[1]
        keys = keys.repeat_interleave(rep, dim=1).transpose(0, 1)  # [Hq, T, Dh]
        values = values.repeat_interleave(rep, dim=1).transpose(0, 1)
        scores = q.transpose(0, 1) @ keys.transpose(1, 2) / math.sqrt(q.shape[-1])  # [Hq, N, T]
        n, t = q.shape[0], keys.shape[1]
        query_pos = torch.arange(past, past + n, device=q.device)[:, None]
        mask = torch.arange(t, device=q.device)[None, :] > query_pos  # [N, T] future keys
        scores = scores.masked_fill(mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        return (probs @ values).transpose(0, 1)  # [N, Hq, Dh]


@pytest.fixture
def dense_attention():
    """A factory: `attn = dense_attention()` gives a fresh single-sequence cache."""
    return DenseCausalAttention
