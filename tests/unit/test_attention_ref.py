"""The reference paged attention against dense causal attention on contiguous tensors."""

import math
import random

import pytest
import torch

from higgs_serve.worker.attention import AttentionMetadata, build_attention_metadata, get_backend
from higgs_serve.worker.attention.torch_ref import write_kv


def dense_causal(q, k, v, start_pos):
    """Independent oracle in float64: q [S, Hq, Dh] at start_pos.. over k/v [T, Hkv, Dh]."""
    groups = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(groups, dim=1)
    v = v.double().repeat_interleave(groups, dim=1)
    scores = torch.einsum("shd,thd->hst", q.double(), k) / math.sqrt(q.shape[2])
    q_pos = torch.arange(start_pos, start_pos + q.shape[0])
    visible = torch.arange(k.shape[0])[None, :] <= q_pos[:, None]
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("hst,thd->shd", scores.softmax(-1), v)


def make_step(rng, gen, starts, q_lens, num_layers, num_blocks, block_size, hkv, hq, dh):
    """Random per-request full K/V histories, pages scattered over a shuffled pool."""
    backend = get_backend("torch")
    caches = backend.allocate_kv_cache(num_layers, num_blocks, block_size, hkv, dh, torch.float32, "cpu")
    pool = list(range(num_blocks))
    rng.shuffle(pool)
    tables = []
    for s, n in zip(starts, q_lens):
        pages = -(-(s + n) // block_size) + rng.randint(0, 1)  # sometimes a spare page
        tables.append([pool.pop() for _ in range(pages)])
    history = [  # history[layer][request] = (k, v): [start + q_len, Hkv, Dh]
        [tuple(torch.randn(s + n, hkv, dh, generator=gen) for _ in "kv") for s, n in zip(starts, q_lens)]
        for _ in range(num_layers)
    ]
    # Earlier steps already wrote positions [0, start): write them through the same scatter.
    past = build_attention_metadata([0] * len(starts), starts, tables, block_size)
    for layer, (k_cache, v_cache) in enumerate(caches):
        k_past = torch.cat([k[:s] for (k, _), s in zip(history[layer], starts)])
        v_past = torch.cat([v[:s] for (_, v), s in zip(history[layer], starts)])
        write_kv(k_past, v_past, k_cache, v_cache, past.slot_mapping)
    meta = build_attention_metadata(starts, q_lens, tables, block_size)
    return backend, caches, history, meta


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("block_size,hq,hkv,dh", [(16, 8, 2, 16), (32, 4, 4, 32), (16, 6, 1, 8)])
def test_reference_matches_dense_causal_on_mixed_batches(seed, block_size, hq, hkv, dh):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    # Mixed batch: fresh prefills, prefill chunks with start_pos > 0 and decodes.
    starts = [0, rng.randint(1, 70), rng.randint(1, 100), rng.randint(1, 40), 0]
    q_lens = [rng.randint(1, 40), rng.randint(2, 30), 1, 1, 1]
    num_layers = 2
    backend, caches, history, meta = make_step(rng, gen, starts, q_lens, num_layers, 64, block_size, hkv, hq, dh)
    attention = backend.bind(meta, caches)
    for layer in range(num_layers):
        k_new = torch.cat([k[s:] for (k, _), s in zip(history[layer], starts)])
        v_new = torch.cat([v[s:] for (_, v), s in zip(history[layer], starts)])
        q = torch.randn(sum(q_lens), hq, dh, generator=gen)
        out = attention(layer, q, k_new, v_new)
        assert out.shape == q.shape and out.dtype == q.dtype
        lo = 0
        for b, (s, n) in enumerate(zip(starts, q_lens)):
            k_full, v_full = history[layer][b]
            expected = dense_causal(q[lo : lo + n], k_full, v_full, s)
            assert (out[lo : lo + n].double() - expected).abs().max().item() <= 1e-5, f"request {b}"
            lo += n


def test_new_tokens_are_written_at_their_slots():
    rng, gen = random.Random(0), torch.Generator().manual_seed(0)
    backend, caches, history, meta = make_step(rng, gen, [5, 0], [3, 2], 1, 8, 4, 2, 4, 16)
    k_new = torch.cat([history[0][0][0][5:], history[0][1][0]])
    v_new = torch.cat([history[0][0][1][5:], history[0][1][1]])
    backend.bind(meta, caches)(0, torch.randn(5, 4, 16), k_new, v_new)
    k_cache, v_cache = caches[0]
    flat_k, flat_v = k_cache.view(-1, 2, 16), v_cache.view(-1, 2, 16)
    assert torch.equal(flat_k[meta.slot_mapping], k_new)
    assert torch.equal(flat_v[meta.slot_mapping], v_new)


def test_padding_slots_and_empty_requests():
    """Negative slots write nothing; a padded request (seq_len 0) gets zeros, not NaN."""
    backend = get_backend("torch")
    caches = backend.allocate_kv_cache(1, 4, 4, 1, 16, torch.float32, "cpu")
    meta = AttentionMetadata(
        query_start_loc=torch.tensor([0, 1, 2], dtype=torch.int32),
        seq_lens=torch.tensor([1, 0], dtype=torch.int32),
        block_tables=torch.tensor([[2], [0]], dtype=torch.int32),
        slot_mapping=torch.tensor([8, -1], dtype=torch.int64),
        max_query_len=1,
        max_seq_len=1,
    )
    assert meta.is_pure_decode
    k = torch.randn(2, 1, 16)
    v = torch.randn(2, 1, 16)
    out = backend.bind(meta, caches)(0, torch.randn(2, 2, 16), k, v)
    # A single visible key: attention returns its value for every head.
    torch.testing.assert_close(out[0], v[0].expand(2, 16))
    assert torch.equal(out[1], torch.zeros(2, 16))
    assert caches[0][0].count_nonzero() == 16  # only slot 8 was written


def test_shape_errors_name_the_tensors():
    backend = get_backend("torch")
    caches = backend.allocate_kv_cache(1, 2, 4, 2, 16, torch.float32, "cpu")
    meta = build_attention_metadata([0], [1], [[0]], 4)
    with pytest.raises(ValueError, match="not a multiple of KV heads"):
        backend.bind(meta, caches)(0, torch.randn(1, 3, 16), torch.randn(1, 2, 16), torch.randn(1, 2, 16))
    with pytest.raises(ValueError, match="unknown attention backend"):
        get_backend("flash")


def test_triton_backend_refuses_cpu_clearly():
    """Without triton the backend says what is missing; with it, CPU caches are refused."""
    try:
        backend = get_backend("triton")
    except RuntimeError as error:
        assert "needs the triton package" in str(error)
        return
    caches = backend.allocate_kv_cache(1, 2, 16, 1, 16, torch.float32, "cpu")
    with pytest.raises(ValueError, match="needs CUDA caches"):
        backend.bind(build_attention_metadata([0], [1], [[0]], 16), caches)
