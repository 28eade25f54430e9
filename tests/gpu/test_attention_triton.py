"""Triton paged attention against the torch reference (CUDA only).

Tolerances: fp32 runs the kernels' dots in IEEE fp32, so outputs agree to ~1e-5 (we allow
1e-4 for the different summation order of split-K). bf16 differs from the fp32-math
reference by the bf16 rounding of the output and of the softmax probabilities fed to the
P·V dot: about 2^-8 relative, so we allow 2e-2 absolute + 2e-2 relative on O(1) outputs.

fp8 caches (`kv_cache_dtype: fp8`): both sides read the same e4m3 values (the reference writes
them with `to_cache`, the kernel with its clamp and cast, and the test checks the bytes agree) and
upcast them exactly, so the tolerance is the compute dtype's.
"""

import random

import pytest
import torch

from higgs_serve.worker.attention import AttentionMetadata, build_attention_metadata, get_backend
from higgs_serve.worker.attention.kv_cache_dtype import byte_view
from higgs_serve.worker.attention.torch_ref import paged_attention, write_kv

TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}
GEOMETRY_4B = dict(hq=32, hkv=8, dh=128, block_size=16)
GEOMETRY_TINY = dict(hq=4, hkv=2, dh=16, block_size=32)
FP8 = torch.float8_e4m3fn
# (compute dtype, cache dtype): the model-dtype caches, and fp8 caches under both compute dtypes
DTYPES = [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.float32, FP8),
          (torch.bfloat16, FP8)]
DTYPE_IDS = ["fp32", "bf16", "fp32-fp8kv", "bf16-fp8kv"]


def same_bytes(a, b):
    """torch.equal through a byte view (float8 has no equality kernel on every build)."""
    return torch.equal(byte_view(a), byte_view(b))


def make_step(seed, starts, q_lens, hq, hkv, dh, block_size, dtype, num_layers=2, cache_dtype=None):
    """Random caches (in `cache_dtype`, default `dtype`) with scattered pages, metadata, and this
    step's q/k/v per layer (in `dtype`)."""
    rng = random.Random(seed)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    tables = []
    num_blocks = sum(-(-(s + n) // block_size) + 1 for s, n in zip(starts, q_lens)) + 4
    pool = list(range(num_blocks))
    rng.shuffle(pool)
    for s, n in zip(starts, q_lens):
        tables.append([pool.pop() for _ in range(-(-(s + n) // block_size))])
    meta = build_attention_metadata(starts, q_lens, tables, block_size, device="cuda")
    shape = (num_blocks, block_size, hkv, dh)
    caches = [
        tuple(torch.randn(shape, generator=gen, device="cuda").to(cache_dtype or dtype) for _ in "kv")
        for _ in range(num_layers)
    ]
    n = sum(q_lens)
    qkv = [
        tuple(torch.randn(n, h, dh, generator=gen, device="cuda").to(dtype) for h in (hq, hkv, hkv))
        for _ in range(num_layers)
    ]
    return meta, caches, qkv


def reference(meta, caches, qkv):
    """Reference outputs per layer on copies of the caches (the originals stay unwritten)."""
    outs, written = [], []
    for (k_cache, v_cache), (q, k, v) in zip(caches, qkv):
        k_cache, v_cache = k_cache.clone(), v_cache.clone()
        write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        outs.append(paged_attention(q, k_cache, v_cache, meta))
        written.append((k_cache, v_cache))
    return outs, written


def run_triton(meta, caches, qkv):
    attention = get_backend("triton").bind(meta, caches)
    return [attention(layer, q, k, v) for layer, (q, k, v) in enumerate(qkv)]


@pytest.mark.parametrize("dtype,cache_dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(
    "geometry,starts",
    [
        (GEOMETRY_4B, [4095]),  # batch 1: many splits
        (GEOMETRY_4B, [0, 15, 16, 17, 1000, 2047, 300, 77]),  # page-boundary contexts
        (GEOMETRY_4B, [random.Random(1).randint(0, 3000) for _ in range(64)]),  # one split
        (GEOMETRY_TINY, [0, 5, 31, 32, 200]),
        (dict(hq=8, hkv=8, dh=64, block_size=16), [63, 64, 65]),
        (dict(hq=16, hkv=2, dh=32, block_size=32), [10, 500]),
    ],
    ids=["4b-batch1-4k", "4b-page-edges", "4b-batch64", "tiny", "mha-d64", "gqa8-d32"],
)
def test_decode_matches_reference(dtype, cache_dtype, geometry, starts):
    meta, caches, qkv = make_step(0, starts, [1] * len(starts), dtype=dtype, cache_dtype=cache_dtype, **geometry)
    assert meta.is_pure_decode
    expected, written = reference(meta, caches, qkv)
    outs = run_triton(meta, caches, qkv)
    for layer, (out, ref) in enumerate(zip(outs, expected)):
        torch.testing.assert_close(out.float(), ref.float(), **TOL[dtype], msg=lambda m: f"layer {layer}: {m}")
        assert same_bytes(caches[layer][0], written[layer][0]) and same_bytes(caches[layer][1], written[layer][1])


@pytest.mark.parametrize("dtype,cache_dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(
    "geometry,starts,q_lens",
    [
        (GEOMETRY_4B, [0], [700]),  # fresh prompt
        (GEOMETRY_4B, [0, 512, 1000, 33, 2000], [130, 256, 1, 1, 64]),  # mixed chunks + decodes
        (GEOMETRY_TINY, [0, 40, 7], [70, 33, 1]),
        (dict(hq=8, hkv=8, dh=64, block_size=16), [16, 0], [17, 1]),
        (dict(hq=16, hkv=2, dh=32, block_size=32), [3, 100], [45, 20]),
    ],
    ids=["4b-prompt", "4b-mixed", "tiny-mixed", "mha-d64", "gqa8-d32"],
)
def test_prefill_matches_reference(dtype, cache_dtype, geometry, starts, q_lens):
    meta, caches, qkv = make_step(1, starts, q_lens, dtype=dtype, cache_dtype=cache_dtype, **geometry)
    expected, written = reference(meta, caches, qkv)
    outs = run_triton(meta, caches, qkv)
    for layer, (out, ref) in enumerate(zip(outs, expected)):
        torch.testing.assert_close(out.float(), ref.float(), **TOL[dtype], msg=lambda m: f"layer {layer}: {m}")
        assert same_bytes(caches[layer][0], written[layer][0]) and same_bytes(caches[layer][1], written[layer][1])


@pytest.mark.parametrize("dtype,cache_dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("geometry,starts,q_lens", [
    (GEOMETRY_4B, [1000, 33, 2047, 0, 512], [1, 1, 1, 130, 64]),
    (GEOMETRY_TINY, [40, 0], [1, 70]),
], ids=["4b", "tiny"])
def test_mixed_step_with_leading_decodes_matches_reference(dtype, cache_dtype, geometry, starts, q_lens):
    """num_decodes > 0: the decode kernel serves the leading one-token requests, the prefill
    kernel the chunks after them; `attend` with `out` writes into the given buffer."""
    meta, caches, qkv = make_step(2, starts, q_lens, dtype=dtype, cache_dtype=cache_dtype, **geometry)
    meta.num_decodes = q_lens.index(max(q_lens)) if geometry is GEOMETRY_TINY else 3
    expected, written = reference(meta, caches, qkv)
    attention = get_backend("triton").bind(meta, caches)
    for layer, (q, k, v) in enumerate(qkv):
        attention.write(layer, k, v)
        out = torch.full_like(q, float("nan"))
        got = attention.attend(layer, q, out=out)
        assert got.data_ptr() == out.data_ptr()
        torch.testing.assert_close(out.float(), expected[layer].float(), **TOL[dtype],
                                   msg=lambda m: f"layer {layer}: {m}")
        assert same_bytes(caches[layer][0], written[layer][0]) and same_bytes(caches[layer][1], written[layer][1])


@pytest.mark.parametrize("dtype,cache_dtype", DTYPES, ids=DTYPE_IDS)
def test_decode_cuda_graph_capture_and_replay(dtype, cache_dtype):
    """Capture once at batch 4, replay with new contexts (and one padded slot) in the same buffers."""
    geometry = GEOMETRY_4B
    batch, num_layers, block_size = 4, 2, geometry["block_size"]
    max_blocks, num_blocks = 256, 400
    hq, hkv, dh = geometry["hq"], geometry["hkv"], geometry["dh"]
    backend = get_backend("triton")
    caches = backend.allocate_kv_cache(num_layers, num_blocks, block_size, hkv, dh, cache_dtype, "cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    for k_cache, v_cache in caches:
        k_cache.copy_(torch.randn(k_cache.shape, generator=gen, device="cuda"))
        v_cache.copy_(torch.randn(v_cache.shape, generator=gen, device="cuda"))
    # Static buffers: the graph reads whatever these hold at replay.
    meta = AttentionMetadata(
        query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device="cuda"),
        seq_lens=torch.ones(batch, dtype=torch.int32, device="cuda"),
        block_tables=torch.zeros(batch, max_blocks, dtype=torch.int32, device="cuda"),
        slot_mapping=torch.full((batch,), -1, dtype=torch.int64, device="cuda"),
        max_query_len=1,
        max_seq_len=max_blocks * block_size,
    )
    q = torch.zeros(num_layers, batch, hq, dh, dtype=dtype, device="cuda")
    k = torch.zeros(num_layers, batch, hkv, dh, dtype=dtype, device="cuda")
    v = torch.zeros_like(k)
    attention = backend.bind(meta, caches)

    def step():
        return torch.stack([attention(layer, q[layer], k[layer], v[layer]) for layer in range(num_layers)])

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm-up: compiles the kernels outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()

    rng = random.Random(0)
    for contexts in ([5, 1000, 17, 0], [3000, 1, 64, 900]):  # 0 = a padded slot
        pool = rng.sample(range(num_blocks), num_blocks)
        tables = [[pool.pop() for _ in range(max(1, -(-c // block_size)))] for c in contexts]
        real = [b for b, c in enumerate(contexts) if c > 0]
        host = build_attention_metadata(
            [contexts[b] - 1 for b in real], [1] * len(real), [tables[b] for b in real], block_size,
            device="cuda", max_blocks=max_blocks,
        )
        # Scatter the real requests into the static buffers; padded slots keep seq_len 0, slot -1.
        meta.seq_lens.zero_()
        meta.slot_mapping.fill_(-1)
        meta.block_tables.zero_()
        index = torch.tensor(real, device="cuda")
        meta.seq_lens[index] = host.seq_lens
        meta.slot_mapping[index] = host.slot_mapping
        meta.block_tables[index] = host.block_tables
        q.copy_(torch.randn(q.shape, generator=gen, device="cuda"))
        k.copy_(torch.randn(k.shape, generator=gen, device="cuda"))
        v.copy_(torch.randn(v.shape, generator=gen, device="cuda"))
        before = [(kc.clone(), vc.clone()) for kc, vc in caches]
        graph.replay()
        torch.cuda.synchronize()
        for layer in range(num_layers):
            k_ref, v_ref = before[layer]
            write_kv(k[layer], v[layer], k_ref, v_ref, meta.slot_mapping)
            ref = paged_attention(q[layer], k_ref, v_ref, meta)
            torch.testing.assert_close(out[layer].float(), ref.float(), **TOL[dtype])
            assert same_bytes(caches[layer][0], k_ref) and same_bytes(caches[layer][1], v_ref)
            for b in set(range(batch)) - set(real):
                assert torch.equal(out[layer][b], torch.zeros(hq, dh, dtype=dtype, device="cuda"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fp8_write_saturates_like_the_reference(dtype):
    """Out-of-range k/v (and inf) land as ±448, never NaN, byte for byte as the reference writes
    them; padded rows (slot -1) write nothing."""
    from higgs_serve.worker.attention.triton_paged import write_kv_triton

    gen = torch.Generator(device="cuda").manual_seed(3)
    k = (300 * torch.randn(6, 8, 128, generator=gen, device="cuda")).to(dtype)
    v = (300 * torch.randn(6, 8, 128, generator=gen, device="cuda")).to(dtype)
    k[0, 0, 0], v[1, 2, 3], v[2, 0, 0] = 1e4, -1e5, float("inf")
    slots = torch.tensor([5, 17, 2, -1, 30, 31], dtype=torch.int64, device="cuda")
    caches = [tuple(torch.zeros(3, 16, 8, 128, dtype=FP8, device="cuda") for _ in "kv") for _ in range(2)]
    write_kv_triton(k, v, *caches[0], slots)
    write_kv(k, v, *caches[1], slots)
    for got, ref in zip(caches[0], caches[1]):
        assert same_bytes(got, ref)
        values = got.float()
        assert not values.isnan().any() and values.abs().max().item() == 448.0
        assert values.view(-1, 8, 128)[[0, 1, 3, 4]].abs().sum().item() == 0.0  # slots never written


def _compiled_variants(kernel) -> int:
    """How many compiled variants a Triton kernel holds (the cache layout moved across versions)."""
    caches = getattr(kernel, "device_caches", None)
    if caches is not None:
        return sum(len(entry[0]) for entry in caches.values())
    return sum(len(entry) for entry in kernel.cache.values())


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, FP8], ids=["bf16", "bf16-fp8kv"])
def test_warm_up_compiles_every_batch_shape_in_advance(cache_dtype):
    """After `warm_up_kernels`, no decode batch size and no mixed step (any number of leading
    decodes: the prefill kernel takes them as an offset, not as a misaligned slice) compiles a
    new kernel variant; with an fp8 cache too (q stays bf16: the warm-up must not use the cache's
    dtype for q)."""
    from higgs_serve.worker.attention import triton_paged as tp

    geometry = dict(GEOMETRY_4B)
    block_size = geometry.pop("block_size")
    num_blocks = 80
    shape = (num_blocks, block_size, geometry["hkv"], geometry["dh"])
    k_cache = torch.zeros(shape, dtype=cache_dtype, device="cuda")
    v_cache = torch.zeros_like(k_cache)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    tp.warm_up_kernels(k_cache, v_cache, geometry["hq"], 64, num_blocks - 1, sms, block_table_width=1,
                       q_dtype=torch.bfloat16)
    kernels = (tp._decode_kernel, tp._decode_reduce_kernel, tp._prefill_kernel)
    before = [_compiled_variants(k) for k in kernels]
    steps = [[1] * b for b in range(1, 65)] + [[1] * d + [7] for d in range(0, 9)]
    for i, q_lens in enumerate(steps):
        meta, caches, qkv = make_step(i, [3] * len(q_lens), q_lens, dtype=torch.bfloat16, block_size=block_size,
                                      num_layers=1, cache_dtype=cache_dtype, **geometry)
        meta.num_decodes = q_lens.count(1)
        get_backend("triton").bind(meta, caches)(0, *qkv[0])
    after = [_compiled_variants(k) for k in kernels]
    assert after == before, "a batch shape compiled an attention kernel after the warm-up"
