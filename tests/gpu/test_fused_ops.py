"""On CUDA: the fused Triton kernels reproduce the reference torch math (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch

from higgs_serve.model.fused_ops import TorchOps, TritonOps
from higgs_serve.model.qwen3 import RotaryEmbedding


def _close(fast: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """fp32: tight relative error. bf16: at most two ulps of the operands (fp32 reductions run in another order, so a normalised value can move by one ulp;
    RoPE's difference of two products then keeps that absolute error even when it cancels to a
    small result, so the bound is in units of the operand scale, ~[2, 4) here: 2^-6 per ulp)."""
    assert fast.shape == ref.shape and fast.dtype == ref.dtype
    if dtype == torch.float32:
        torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-5)
        return
    diff = (fast.float() - ref.float()).abs()
    ulp = torch.exp2(torch.floor(torch.log2(ref.float().abs().clamp(min=1e-3))) - 7)
    bound = torch.maximum(2 * ulp, torch.full_like(ulp, 2.0**-5))
    assert bool((diff <= bound).all()), f"max diff {diff.max().item()}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 5, 64])
def test_rms_norm(dtype, n):
    g = torch.Generator(device="cuda").manual_seed(n)
    x = torch.randn(n, 2560, device="cuda", generator=g).to(dtype) * 3
    w = (1 + 0.1 * torch.randn(2560, device="cuda", generator=g)).to(dtype)
    _close(TritonOps.rms_norm(x, w, 1e-6), TorchOps.rms_norm(x, w, 1e-6), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [16, 128])
def test_qk_norm_rope(dtype, head_dim):
    n, hq, hkv = 7, 8, 2
    g = torch.Generator(device="cuda").manual_seed(head_dim)
    qkv = torch.randn(n, (hq + 2 * hkv) * head_dim, device="cuda", generator=g).to(dtype)
    qw = (1 + 0.1 * torch.randn(head_dim, device="cuda", generator=g)).to(dtype)
    kw = (1 + 0.1 * torch.randn(head_dim, device="cuda", generator=g)).to(dtype)
    positions = torch.tensor([0, 1, 2, 100, 1000, 4095, 8000], device="cuda")
    cos, sin = RotaryEmbedding(head_dim, 1e6, device="cuda")(positions, dtype)
    fast = TritonOps.qk_norm_rope(qkv, qw, kw, 1e-6, cos, sin, hq, hkv, head_dim)
    ref = TorchOps.qk_norm_rope(qkv, qw, kw, 1e-6, cos, sin, hq, hkv, head_dim)
    for a, b in zip(fast, ref):
        _close(a.contiguous(), b.contiguous(), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul(dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    gate_up = torch.randn(9, 2 * 9728, device="cuda", generator=g).to(dtype) * 4
    _close(TritonOps.silu_mul(gate_up), TorchOps.silu_mul(gate_up), dtype)


def test_talker_fused_matches_reference_fp32(tiny_model_dir, dense_attention):
    """The whole backbone with fused kernels vs the reference math, fp32 on CUDA."""
    from higgs_serve.model.checkpoint import load_checkpoint
    from higgs_serve.model.hf_config import load_model_spec
    from higgs_serve.model.talker import Talker

    spec = load_model_spec(tiny_model_dir)
    talker = Talker(spec.text, spec.audio, dtype=torch.float32, device="cuda")
    talker.load_talker_weights({k: v.cuda() for k, v in load_checkpoint(tiny_model_dir, spec).talker.items()})
    ids = torch.arange(3, 40, device="cuda")
    pos = torch.arange(len(ids), device="cuda")
    fused = talker(talker.embed_text(ids), pos, dense_attention())
    talker.backbone.set_ops(TorchOps)
    ref = talker(talker.embed_text(ids), pos, dense_attention())
    torch.testing.assert_close(fused, ref, rtol=1e-4, atol=1e-4)
