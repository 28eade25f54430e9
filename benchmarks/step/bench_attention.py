"""Decode attention at the 4B geometry: Triton paged kernel vs the bytes-moved floor.

    python benchmarks/step/bench_attention.py [--layers 36] [--json out.json]

Per (batch, context) it captures one CUDA graph of `--layers` attention calls (KV write +
split-K decode + merge), each layer on its own cache so the KV reads are not L2-hot, and
reports the time per layer beside the floor = KV bytes read / measured device copy bandwidth.
A dense SDPA (contiguous KV, same bytes) is timed the same way as a baseline.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random

import torch
import torch.nn.functional as F

from higgs_serve.worker.attention import build_attention_metadata, get_backend, triton_backend, triton_paged
from higgs_serve.worker.attention.triton_paged import decode_num_splits

HQ, HKV, DH, BLOCK_SIZE = 32, 8, 128, 16
DTYPE = torch.bfloat16


def copy_bandwidth(num_bytes: int = 2 << 30, iters: int = 20) -> float:
    """Device copy bandwidth in bytes/s, counting read + write."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    return 2 * num_bytes * iters / (start.elapsed_time(end) / 1e3)


def time_graph(fn, iters: int) -> float:
    """Seconds per replay of a CUDA graph of `fn` (after an eager warm-up that compiles kernels)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def bench_paged(batch: int, context: int, layers: int, iters: int) -> float:
    """Seconds per layer of the Triton decode step (write + attention) at `context` tokens each."""
    pages = -(-context // BLOCK_SIZE)
    num_blocks = batch * pages
    backend = get_backend("triton")
    caches = backend.allocate_kv_cache(layers, num_blocks, BLOCK_SIZE, HKV, DH, DTYPE, "cuda")
    for k_cache, v_cache in caches:
        k_cache.normal_()
        v_cache.normal_()
    pool = random.Random(0).sample(range(num_blocks), num_blocks)  # scattered pages
    tables = [pool[b * pages : (b + 1) * pages] for b in range(batch)]
    meta = build_attention_metadata([context - 1] * batch, [1] * batch, tables, BLOCK_SIZE, device="cuda")
    q = torch.randn(batch, HQ, DH, dtype=DTYPE, device="cuda")
    k = torch.randn(batch, HKV, DH, dtype=DTYPE, device="cuda")
    v = torch.randn_like(k)
    attention = backend.bind(meta, caches)

    def step():
        for layer in range(layers):
            attention(layer, q, k, v)

    return time_graph(step, iters) / layers


def bench_sdpa(batch: int, context: int, layers: int, iters: int) -> float:
    """Seconds per layer of dense SDPA over contiguous KV [B, Hkv, T, Dh] (no paging, no write)."""
    kv = [
        (
            torch.randn(batch, HKV, context, DH, dtype=DTYPE, device="cuda"),
            torch.randn(batch, HKV, context, DH, dtype=DTYPE, device="cuda"),
        )
        for _ in range(layers)
    ]
    q = torch.randn(batch, HQ, 1, DH, dtype=DTYPE, device="cuda")

    def step():
        for k, v in kv:
            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    return time_graph(step, iters) / layers


def sweep(batches: list[int], contexts: list[int], layers: int, iters: int, bandwidth: float) -> list[dict]:
    """The decode kernel's launch shape (BLOCK_N, warps, pipeline stages) and split count per
    (batch, context), each timed as `bench_paged` times the shipped one."""
    shipped = (triton_paged.DECODE_BLOCK_N, triton_paged.DECODE_NUM_WARPS, triton_paged.DECODE_NUM_STAGES)
    default_splits = triton_backend.decode_num_splits
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    try:
        for batch in batches:
            for context in contexts:
                floor = batch * context * HKV * DH * 2 * DTYPE.itemsize / bandwidth
                base = default_splits(batch, HKV, sms)
                for block_n, warps, stages, splits in itertools.product((16, 32, 64, 128), (4, 8), (1, 2, 3, 4),
                                                                        sorted({base, 2 * base, 4 * base})):
                    triton_paged.DECODE_BLOCK_N, triton_paged.DECODE_NUM_WARPS = block_n, warps
                    triton_paged.DECODE_NUM_STAGES = stages
                    triton_backend.decode_num_splits = lambda *_, n=splits: n
                    try:
                        us = bench_paged(batch, context, layers, iters) * 1e6
                    except Exception as exc:  # a shape the kernel cannot take (shared memory): skip it
                        print(f"B={batch} L={context} {block_n}/{warps}/{stages}/{splits}: {type(exc).__name__}")
                        continue
                    finally:
                        torch.cuda.empty_cache()
                    rows.append(dict(batch=batch, context=context, block_n=block_n, warps=warps, stages=stages,
                                     splits=splits, triton_us=us, floor_us=floor * 1e6,
                                     shipped=(block_n, warps, stages) == shipped and splits == base))
                best = sorted((r for r in rows if (r["batch"], r["context"]) == (batch, context)),
                              key=lambda r: r["triton_us"])
                ship = next((r for r in best if r["shipped"]), None)
                print(f"B={batch} L={context}: shipped {ship and round(ship['triton_us'], 1)} us; best "
                      + ", ".join(f"{r['block_n']}/{r['warps']}/{r['stages']}/{r['splits']} {r['triton_us']:.1f}"
                                  for r in best[:5]), flush=True)
    finally:
        triton_paged.DECODE_BLOCK_N, triton_paged.DECODE_NUM_WARPS, triton_paged.DECODE_NUM_STAGES = shipped
        triton_backend.decode_num_splits = default_splits
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=36)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--contexts", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--no-sdpa", action="store_true", help="skip the dense SDPA baseline")
    parser.add_argument("--sweep", action="store_true",
                        help="time the decode kernel's BLOCK_N x warps x stages x splits instead (BLOCK_N/warps/stages/splits)")
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args()

    bandwidth = copy_bandwidth()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name(0)}: copy bandwidth {bandwidth / 1e9:.0f} GB/s (read+write), {sms} SMs")
    if args.sweep:
        rows = sweep(args.batches, args.contexts, args.layers, args.iters, bandwidth)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(device=torch.cuda.get_device_name(0), copy_bandwidth=bandwidth, rows=rows), f, indent=2)
        return
    print(
        f"{'batch':>5} {'ctx':>5} {'splits':>6} {'KV MB':>7} {'floor us':>9} "
        f"{'triton us':>10} {'eff':>5} {'sdpa us':>8}"
    )
    rows = []
    for batch in args.batches:
        for context in args.contexts:
            kv_bytes = batch * context * HKV * DH * 2 * DTYPE.itemsize  # k + v, per layer
            floor = kv_bytes / bandwidth
            paged = bench_paged(batch, context, args.layers, args.iters)
            torch.cuda.empty_cache()  # the caches died with bench_paged's frame
            dense = float("nan") if args.no_sdpa else bench_sdpa(batch, context, args.layers, args.iters)
            torch.cuda.empty_cache()
            row = dict(
                batch=batch, context=context, splits=decode_num_splits(batch, HKV, sms),
                kv_mb=kv_bytes / 1e6, floor_us=floor * 1e6, triton_us=paged * 1e6,
                efficiency=floor / paged, sdpa_us=dense * 1e6,
            )
            rows.append(row)
            print(
                f"{batch:>5} {context:>5} {row['splits']:>6} {row['kv_mb']:>7.1f} {row['floor_us']:>9.1f} "
                f"{row['triton_us']:>10.1f} {row['efficiency']:>5.2f} {row['sdpa_us']:>8.1f}"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(0), copy_bandwidth=bandwidth, rows=rows), f, indent=2)


if __name__ == "__main__":
    main()
