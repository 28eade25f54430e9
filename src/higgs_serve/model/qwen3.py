"""Qwen3 decoder math (docs/model.md#talker): RMSNorm, neox RoPE, GQA attention projections, SwiGLU.

Pure math on flat token batches: every tensor is [N, ...] where N is the number of tokens of all
requests in the step. The attention itself (KV cache, causal masking, GQA broadcast, softmax
scale 1/sqrt(head_dim)) is an injected callable, so the same layers serve prefill, decode and
mixed batches with any backend.

Numerics follow transformers' Qwen3 exactly: RMSNorm normalises in float32, casts back to the
input dtype, then multiplies by the weight; RoPE angles are computed in float32 from the integer
positions and cos/sin are cast to the activation dtype before rotating. Weights are kept fused
(one qkv matmul, one gate_up matmul); the result is the same math as the separate projections.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor, nn

from higgs_serve.model.fused_ops import TorchOps, ops_for
from higgs_serve.model.hf_config import TextConfig


class Attention(Protocol):
    """attention(layer_idx, q [N, Hq, Dh], k [N, Hkv, Dh], v [N, Hkv, Dh]) -> [N, Hq, Dh].

    q and k arrive after q/k-norm and RoPE. The callable owns the KV cache: it writes the new k/v
    and attends causally over each request's whole context with scale head_dim ** -0.5.
    """

    def __call__(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor: ...


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, *, dtype: torch.dtype, device: torch.device | str,
                 ops: type[TorchOps] = TorchOps):
        super().__init__()
        self.eps = eps
        self.ops = ops
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype, device=device), requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.ops.rms_norm(x, self.weight, self.eps)


class RotaryEmbedding(nn.Module):
    """neox-style RoPE: the head dim is split in two halves that rotate together."""

    def __init__(self, head_dim: int, theta: float, *, device: torch.device | str):
        super().__init__()
        exponent = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
        self.register_buffer("inv_freq", 1.0 / (theta ** exponent), persistent=False)  # [Dh/2] fp32

    def forward(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """positions [N] int64 -> (cos, sin) [N, 1, Dh] in `dtype` (angles computed in fp32)."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # [N, Dh/2]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # [N, 1, Dh]
        return emb.cos().to(dtype), emb.sin().to(dtype)


class Qwen3Layer(nn.Module):
    """One pre-norm decoder layer. Parameters are fused: qkv_proj [q+2kv, D], gate_up_proj [2I, D]."""

    def __init__(self, cfg: TextConfig, layer_idx: int, *, dtype: torch.dtype, device: torch.device | str):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size, self.kv_size = cfg.q_size, cfg.kv_size
        self.intermediate_size = cfg.intermediate_size
        self.eps = cfg.rms_norm_eps
        # fused CUDA kernels on GPU, the plain reference math elsewhere (same rounding points)
        self.ops = ops = ops_for(device)
        d = cfg.hidden_size

        def weight(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device), requires_grad=False)

        self.input_norm = RMSNorm(d, cfg.rms_norm_eps, dtype=dtype, device=device, ops=ops)
        self.qkv_proj = weight(self.q_size + 2 * self.kv_size, d)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype=dtype, device=device)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype=dtype, device=device)
        self.o_proj = weight(d, self.q_size)
        self.post_attention_norm = RMSNorm(d, cfg.rms_norm_eps, dtype=dtype, device=device, ops=ops)
        self.gate_up_proj = weight(2 * cfg.intermediate_size, d)
        self.down_proj = weight(d, cfg.intermediate_size)

    def run_gemms(self, rows: int) -> None:
        """The layer's four GEMMs on zeros, called as a step of `rows` tokens calls them (kernel
        warm-up; the attention and its cache are not touched)."""
        h = torch.zeros(rows, self.o_proj.shape[0], dtype=self.o_proj.dtype, device=self.o_proj.device)
        self.ops.linear(self.input_norm(h), self.qkv_proj)
        self.mlp_residual(self.o_proj_residual(torch.zeros(rows, self.q_size, dtype=h.dtype, device=h.device), h))

    def pre_attention(self, h: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v of h [N, D]: rope(norm(q)), rope(norm(k)), v, each [N, heads, Dh]."""
        qkv = self.ops.linear(self.input_norm(h), self.qkv_proj)  # [N, q + 2kv]
        return self.ops.qk_norm_rope(qkv, self.q_norm.weight, self.k_norm.weight, self.eps, cos, sin,
                                     self.num_heads, self.num_kv_heads, self.head_dim)

    def attn_residual(self, h: Tensor, cos: Tensor, sin: Tensor, attention: Attention,
                      dest: Tensor | None = None) -> Tensor:
        """h + o_proj(attention(rope(norm(q)), rope(norm(k)), v)) for h [N, D], into `dest` when
        given (an [N, D] buffer, or h itself: the sum is then written in place)."""
        q, k, v = self.pre_attention(h, cos, sin)
        return self.o_proj_residual(attention(self.layer_idx, q, k, v), h, dest)

    def o_proj_residual(self, out: Tensor, h: Tensor, dest: Tensor | None = None) -> Tensor:
        """h + o_proj(out) for the attention output out [N, Hq, Dh] (into `dest` when given)."""
        return self.ops.linear_residual(out.reshape(h.shape[0], self.q_size), self.o_proj, h, dest)

    def mlp_residual(self, h: Tensor, out: Tensor | None = None) -> Tensor:
        """h + down(silu(gate(norm(h))) * up(norm(h))): the part a per-layer MLP graph replays.
        Into `out` when given (h itself: in place)."""
        act = self.ops.linear_silu_mul(self.post_attention_norm(h), self.gate_up_proj)  # [N, I]
        return self.ops.linear_residual(act, self.down_proj, h, out)

    def forward(self, h: Tensor, cos: Tensor, sin: Tensor, attention: Attention) -> Tensor:
        return self.mlp_residual(self.attn_residual(h, cos, sin, attention))


class MLPRunner(Protocol):
    """mlp(layer_idx, h [N, D]) -> h + MLP(norm(h)): lets a caller replay the post-attention
    half of a layer (e.g. as a CUDA graph) without the model knowing how it is run.
    `input_rows(n)`: an [n, D] buffer the attention half may write h into (a replayed graph's
    static input: no copy), or None."""

    def input_rows(self, n: int) -> Tensor | None: ...

    def __call__(self, layer_idx: int, h: Tensor) -> Tensor: ...


class Qwen3Backbone(nn.Module):
    """The decoder stack and final norm (no embedding, no head)."""

    def __init__(self, cfg: TextConfig, *, dtype: torch.dtype, device: torch.device | str):
        super().__init__()
        self.layers = nn.ModuleList(Qwen3Layer(cfg, i, dtype=dtype, device=device) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype, device=device)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, device=device)

    def set_ops(self, ops: type[TorchOps]) -> None:
        """Switch every layer between the fused kernels and the reference math (tests)."""
        for module in self.modules():
            if hasattr(module, "ops"):
                module.ops = ops

    def forward(self, embeds: Tensor, positions: Tensor, attention: Attention,
                mlp: MLPRunner | None = None) -> Tensor:
        """embeds [N, D], positions [N] int64 -> final-normed hidden [N, D]."""
        cos, sin = self.rotary(positions, embeds.dtype)
        return self.norm(self.decoder(embeds, cos, sin, attention, mlp))

    def decoder(self, embeds: Tensor, cos: Tensor, sin: Tensor, attention: Attention,
                mlp: MLPRunner | None = None) -> Tensor:
        """The layer stack on embeds [N, D] with the step's RoPE tables (`rotary`): the hidden
        states before the final norm."""
        h = embeds
        if mlp is None:
            for i, layer in enumerate(self.layers):
                # From the first sum on, h is this forward's own buffer, and each residual sum is
                # written into it in place: cuBLAS's addmm (where it runs) copies its residual into any
                # other output first (a device copy per GEMM, ~1.5 us each on the H200 at 64 rows).
                h = layer.attn_residual(h, cos, sin, attention, h if i else None)
                h = layer.mlp_residual(h, out=h)
        else:
            dest = mlp.input_rows(h.shape[0])
            for layer in self.layers:
                h = mlp(layer.layer_idx, layer.attn_residual(h, cos, sin, attention, dest))
        return h
