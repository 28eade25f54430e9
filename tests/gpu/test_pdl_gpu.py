"""On CUDA (Hopper and later): kernels launched with programmatic dependent launch (kernels/pdl.py)
give exactly the bits of plain launches, eagerly and captured in a CUDA graph.

The chain is every PDL kernel of a decode layer at the 4B width, each reading its predecessor's
output: o projection with split-K and its reduce, RMSNorm, gate_up, SiLU-multiply, down with
the residual, RMSNorm, qkv, q/k-norm + RoPE, the KV write and the split decode attention with
its merge. The graph is replayed with fresh inputs: a kernel that read its predecessor's output
before the wait would see the previous replay's values and differ. Skipped without CUDA.
"""

from __future__ import annotations

import pytest
import torch

from higgs_serve.kernels import pdl
from higgs_serve.model.fused_ops import TritonOps
from higgs_serve.worker.attention.metadata import build_attention_metadata
from higgs_serve.worker.attention.triton_paged import DecodeWorkspace, decode_num_splits, paged_decode, write_kv_triton

D, I, HQ, HKV, DH, EPS = 2560, 9728, 32, 8, 128, 1e-6
BATCH, CONTEXT, BLOCK = 4, 100, 16


@pytest.fixture(autouse=True)
def _restore():
    yield
    pdl.set_enabled(None)


def _randn(*shape, gen, scale=1.0):
    return (torch.randn(*shape, device="cuda", generator=gen) * scale).to(torch.bfloat16)


@pytest.fixture(scope="module")
def layer():
    g = torch.Generator(device="cuda").manual_seed(0)
    w = {"o": _randn(D, HQ * DH, gen=g, scale=(HQ * DH) ** -0.5), "gate_up": _randn(2 * I, D, gen=g, scale=D ** -0.5),
         "down": _randn(D, I, gen=g, scale=I ** -0.5), "qkv": _randn((HQ + 2 * HKV) * DH, D, gen=g, scale=D ** -0.5),
         "norm": _randn(D, gen=g), "q_norm": _randn(DH, gen=g), "k_norm": _randn(DH, gen=g)}
    blocks = -(-(CONTEXT + 1) // BLOCK)
    tables = [list(range(b * blocks, (b + 1) * blocks)) for b in range(BATCH)]
    meta = build_attention_metadata([CONTEXT] * BATCH, [1] * BATCH, tables, BLOCK, device="cuda")
    caches = [_randn(BATCH * blocks, BLOCK, HKV, DH, gen=g) for _ in range(2)]
    angles = torch.arange(CONTEXT, CONTEXT + 1, device="cuda").float()[:, None] * torch.rand(DH // 2, device="cuda")
    emb = torch.cat((angles, angles), -1).expand(BATCH, DH)
    work = DecodeWorkspace(BATCH, HQ, DH, decode_num_splits(BATCH, HKV, torch.cuda.get_device_properties(0)
                                                            .multi_processor_count), torch.device("cuda"))
    return w, meta, caches, emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16), work


def _chain(layer, attn_out, h):
    w, meta, (k_cache, v_cache), cos, sin, work = layer
    h = TritonOps.linear_residual(attn_out, w["o"], h)
    gate_up = TritonOps.linear(TritonOps.rms_norm(h, w["norm"], EPS), w["gate_up"])
    h = TritonOps.linear_residual(TritonOps.silu_mul(gate_up), w["down"], h)
    qkv = TritonOps.linear(TritonOps.rms_norm(h, w["norm"], EPS), w["qkv"])
    q, k, v = TritonOps.qk_norm_rope(qkv, w["q_norm"], w["k_norm"], EPS, cos, sin, HQ, HKV, DH)
    write_kv_triton(k, v, k_cache, v_cache, meta.slot_mapping)
    return h, paged_decode(q, k_cache, v_cache, meta, work)


def _inputs(seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return _randn(BATCH, HQ * DH, gen=g), _randn(BATCH, D, gen=g)


def test_pdl_is_on_for_hopper():
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs Hopper or later")
    assert pdl.enabled(torch.device("cuda"))
    assert pdl.launch_args(torch.device("cuda")) == {"USE_PDL": True, "launch_pdl": True}


def test_pdl_chain_matches_plain_launches_eager_and_in_a_graph(layer):
    seeds = [1, 2, 3]
    pdl.set_enabled(False)
    expected = [tuple(t.clone() for t in _chain(layer, *_inputs(s))) for s in seeds]

    pdl.set_enabled(True)
    for s, want in zip(seeds, expected):
        got = _chain(layer, *_inputs(s))
        assert all(torch.equal(a, b) for a, b in zip(got, want)), f"eager PDL chain differs (seed {s})"

    static = [t.clone() for t in _inputs(0)]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        _chain(layer, *static)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = _chain(layer, *static)
    for s, want in zip(seeds, expected):
        for buf, value in zip(static, _inputs(s)):
            buf.copy_(value)
        graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(outs, want)), f"graph PDL chain differs (seed {s})"
