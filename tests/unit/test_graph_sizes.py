"""Which captured size serves a count (`cuda_graphs.padded_size`, used by the step dispatch and
the sampling graphs of eager steps), and the backbone writing each layer's attention half into
an MLP runner's static input rows, as the MLP graphs use it (CPU, reference ops)."""

from __future__ import annotations

import pytest
import torch

from higgs_serve.model.hf_config import TextConfig
from higgs_serve.model.qwen3 import Qwen3Backbone
from higgs_serve.worker.cuda_graphs import padded_size


@pytest.mark.parametrize("n,expected", [(1, 1), (2, 2), (3, 4), (8, 8), (9, 16), (16, 16), (17, None)])
def test_padded_size_is_the_smallest_captured_size_that_fits(n, expected):
    assert padded_size((1, 2, 4, 8, 16), n) == expected


def test_no_captured_sizes_serve_nothing():
    assert padded_size((), 1) is None


class _StaticInputMLP:
    """An MLP runner with a static input buffer, like MLPGraphs: it checks the attention half
    wrote into it and runs the layer's MLP eagerly into a separate output buffer."""

    def __init__(self, layers, rows: int, hidden: int):
        self.layers = layers
        self.inp = torch.full((rows, hidden), float("nan"))
        self.out = torch.zeros(rows, hidden)
        self.calls = 0

    def input_rows(self, n: int) -> torch.Tensor:
        return self.inp[:n]

    def __call__(self, layer_idx: int, h: torch.Tensor) -> torch.Tensor:
        assert h.data_ptr() == self.inp.data_ptr()  # written in place, no copy
        self.calls += 1
        n = h.shape[0]
        self.out[:n] = self.layers[layer_idx].mlp_residual(self.inp[:n])
        return self.out[:n]


def test_attention_half_writes_into_the_mlp_runner_input_rows_with_the_same_result():
    torch.manual_seed(0)
    cfg = TextConfig.preset_tiny(vocab_size=32)
    backbone = Qwen3Backbone(cfg, dtype=torch.float32, device="cpu")
    for p in backbone.parameters():
        p.normal_(0, 0.2)

    def attention(layer_idx, q, k, v):  # any function of q, k, v will do for the composition
        return q + k.repeat_interleave(q.shape[1] // k.shape[1], dim=1) * v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)

    embeds, positions = torch.randn(5, cfg.hidden_size), torch.arange(5)
    mlp = _StaticInputMLP(backbone.layers, rows=8, hidden=cfg.hidden_size)
    got = backbone(embeds, positions, attention, mlp)
    assert mlp.calls == cfg.num_layers
    assert torch.equal(got, backbone(embeds, positions, attention))
