"""kv_cache_dtype on CPU: the dtype it resolves to, the saturating fp8 write, the bytes it saves
(the real 4B geometry), the KV pool sizing, and the torch reference reading an fp8 cache."""

import random
from types import SimpleNamespace

import pytest
import torch

from higgs_serve.config.loader import load_deploy_config
from higgs_serve.engine import builder
from higgs_serve.model.talker import Talker
from higgs_serve.model.tiny import spec_4b
from higgs_serve.worker.attention import build_attention_metadata, get_backend
from higgs_serve.worker.attention.kv_cache_dtype import (
    FP8_E4M3_MAX,
    from_cache,
    kv_bytes_per_token,
    resolve_kv_cache_dtype,
    to_cache,
)
from higgs_serve.worker.attention.torch_ref import write_kv

FP8 = torch.float8_e4m3fn
CONCURRENT, CONTEXT = 64, 4096  # the target: 64 requests of 4k tokens on one 40 GB budget


@pytest.mark.parametrize("model_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_auto_is_the_model_dtype_and_fp8_is_e4m3_for_any_model_dtype(model_dtype):
    assert resolve_kv_cache_dtype("auto", model_dtype) is model_dtype
    assert resolve_kv_cache_dtype("fp8", model_dtype) is FP8
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        resolve_kv_cache_dtype("fp8_e5m2", model_dtype)


def test_fp8_write_saturates_instead_of_nan_and_read_is_exact():
    x = torch.tensor([1000.0, -1e6, 448.0, 1.0, -0.5, 0.0, 2.625, float("inf")])
    cached = to_cache(x, FP8)
    assert cached.dtype == FP8
    back = from_cache(cached, torch.float32)
    assert not torch.isnan(back).any()
    assert back.tolist() == [448.0, -448.0, 448.0, 1.0, -0.5, 0.0, 2.5, 448.0]  # 2.625: a tie, to even
    # e4m3 values are exact in bf16: reading into bf16 or fp32 gives the same numbers
    assert torch.equal(from_cache(cached, torch.bfloat16).float(), back)
    # the model dtype cache: no conversion at all
    y = torch.randn(4, dtype=torch.bfloat16)
    assert to_cache(y, torch.bfloat16) is y and from_cache(y, torch.bfloat16) is y
    assert FP8_E4M3_MAX == torch.finfo(FP8).max


def test_4b_geometry_kv_bytes_for_64_requests_of_4k_tokens():
    text = spec_4b().text
    assert (text.hidden_size, text.num_layers, text.num_heads, text.num_kv_heads, text.head_dim,
            text.intermediate_size) == (2560, 36, 32, 8, 128, 9728)
    assert kv_bytes_per_token(text, torch.bfloat16) == 36 * 2 * 8 * 128 * 2 == 147_456
    assert kv_bytes_per_token(text, FP8) == 73_728
    tokens = CONCURRENT * CONTEXT
    assert kv_bytes_per_token(text, FP8) * tokens / 1e9 == pytest.approx(19.3, abs=0.05)
    assert kv_bytes_per_token(text, torch.bfloat16) * tokens / 1e9 == pytest.approx(38.7, abs=0.05)
    assert builder.kv_bytes_per_block(spec_4b(), 16, FP8) == 16 * 73_728


def test_4b_weights_plus_fp8_kv_fit_in_40_gb_and_bf16_kv_does_not():
    spec = spec_4b()
    talker = Talker(spec.text, spec.audio, dtype=torch.bfloat16, device="meta")  # shapes, no memory
    weight_bytes = sum(p.numel() * p.element_size() for p in talker.parameters())
    assert weight_bytes / 1e9 == pytest.approx(8.09, abs=0.01)
    tokens = CONCURRENT * CONTEXT
    assert weight_bytes + kv_bytes_per_token(spec.text, FP8) * tokens < 40e9 - builder._GPU_RESERVE_BYTES
    assert weight_bytes + kv_bytes_per_token(spec.text, torch.bfloat16) * tokens > 40e9


@pytest.mark.parametrize("name, expected_dtype", [("auto", torch.bfloat16), ("fp8", FP8)])
def test_kv_pool_sizing_uses_the_cache_itemsize(name, expected_dtype):
    """The same memory budget holds twice the blocks in fp8 (the CPU budget stands in for the
    GPU's free memory: the arithmetic is the same)."""
    loaded = SimpleNamespace(spec=spec_4b(), dtype=torch.bfloat16, device=torch.device("cpu"))
    deploy = load_deploy_config(None, "higgs_multimodal_qwen3",
                                cli_overrides={"0": {"devices": "cpu", "kv_cache_dtype": name}})
    kv = builder.size_kv_cache(loaded, deploy)
    per_block = builder.kv_bytes_per_block(loaded.spec, kv.block_size, expected_dtype)
    assert kv.dtype is expected_dtype
    assert kv.num_blocks == builder._CPU_KV_BUDGET_BYTES // per_block
    explicit = load_deploy_config(None, "higgs_multimodal_qwen3", cli_overrides={
        "0": {"devices": "cpu", "kv_cache_dtype": name, "num_gpu_blocks": 7}})
    assert builder.size_kv_cache(loaded, explicit).dtype is expected_dtype


def test_fp8_pool_holds_twice_the_blocks_of_bf16():
    loaded = SimpleNamespace(spec=spec_4b(), dtype=torch.bfloat16, device=torch.device("cpu"))
    blocks = {}
    for name in ("auto", "fp8"):
        deploy = load_deploy_config(None, "higgs_multimodal_qwen3",
                                    cli_overrides={"0": {"devices": "cpu", "kv_cache_dtype": name}})
        blocks[name] = builder.size_kv_cache(loaded, deploy).num_blocks
    assert blocks["fp8"] == 2 * blocks["auto"]


@pytest.mark.parametrize("compute_dtype", [torch.float32, torch.bfloat16])
def test_torch_reference_reads_an_fp8_cache_as_the_dequantized_values(compute_dtype):
    """Written through the fp8 cache, attention equals attention over the rounded k/v (the
    rounding is the only difference), and the slots hold the e4m3 bytes of the clamped rows."""
    rng, gen = random.Random(0), torch.Generator().manual_seed(0)
    block_size, hq, hkv, dh = 4, 8, 2, 16
    starts, q_lens = [0, 6, 3], [5, 1, 4]
    pool = list(range(12))
    rng.shuffle(pool)
    tables = [[pool.pop() for _ in range(-(-(s + n) // block_size))] for s, n in zip(starts, q_lens)]
    backend = get_backend("torch")
    fp8_caches = backend.allocate_kv_cache(1, 12, block_size, hkv, dh, FP8, "cpu")
    exact_caches = backend.allocate_kv_cache(1, 12, block_size, hkv, dh, compute_dtype, "cpu")
    history = [tuple(3 * torch.randn(s + n, hkv, dh, generator=gen) for _ in "kv") for s, n in zip(starts, q_lens)]
    history[0][1][0, 0, 0] = 1000.0  # a V outlier: saturates at 448, never NaN
    # what the fp8 cache holds: the rows in the compute dtype, clamped, rounded to e4m3, read back
    rounded = [tuple(from_cache(to_cache(t.to(compute_dtype), FP8), compute_dtype) for t in kv) for kv in history]
    past = build_attention_metadata([0] * 3, starts, tables, block_size)
    meta = build_attention_metadata(starts, q_lens, tables, block_size)
    q = torch.randn(sum(q_lens), hq, dh, generator=gen).to(compute_dtype)
    outs = []
    for caches, source in ((fp8_caches, history), (exact_caches, rounded)):
        for j, new in ((0, past), (1, meta)):  # earlier steps, then this step
            lo = [0 if j == 0 else s for s in starts]
            hi = starts if j == 0 else [s + n for s, n in zip(starts, q_lens)]
            k = torch.cat([kv[0][a:b] for kv, a, b in zip(source, lo, hi)]).to(compute_dtype)
            v = torch.cat([kv[1][a:b] for kv, a, b in zip(source, lo, hi)]).to(compute_dtype)
            if j == 0:
                write_kv(k, v, *caches[0], new.slot_mapping)
            else:
                outs.append(backend.bind(new, caches)(0, q, k, v))
    got, expected = outs
    assert got.dtype == compute_dtype and torch.isfinite(got.float()).all()
    assert torch.equal(got, expected)  # the same numbers in, the same fp32 math
    assert fp8_caches[0][0].dtype == FP8 and fp8_caches[0][1].float().abs().max() == 448.0
    flat = fp8_caches[0][0].view(torch.uint8).view(-1, hkv, dh)
    k_new = torch.cat([kv[0][s:] for kv, s in zip(history, starts)]).to(compute_dtype)
    assert torch.equal(flat[meta.slot_mapping], to_cache(k_new, FP8).view(torch.uint8))


def test_fp8_cache_accepts_any_compute_dtype_but_other_mismatches_are_errors():
    backend = get_backend("torch")
    meta = build_attention_metadata([0], [1], [[0]], 4)
    q, k, v = torch.randn(1, 2, 16), torch.randn(1, 2, 16), torch.randn(1, 2, 16)
    fp8 = backend.allocate_kv_cache(1, 2, 4, 2, 16, FP8, "cpu")
    assert backend.bind(meta, fp8)(0, q, k, v).dtype == torch.float32
    bf16 = backend.allocate_kv_cache(1, 2, 4, 2, 16, torch.bfloat16, "cpu")
    with pytest.raises(ValueError, match="differs from the cache dtype"):
        backend.bind(meta, bf16)(0, q, k, v)
