"""Decode-step GEMMs of the talker: cuBLAS (F.linear / addmm) against the skinny Triton kernel's
launch shapes, per weight shape and row count, beside the copy bandwidth measured in the same run.

Each timing is a CUDA graph of one GEMM per layer, each layer with its own weight (num_layers
distinct copies, far larger than L2), so weights stream from HBM as they do in a real step; the
time per GEMM is the graph's time / num_layers. Every skinny result is checked against a float32
reference before it is timed.

Usage (GPU): PYTHONPATH=src python3 benchmarks/step/bench_gemm.py --model /tmp/h4b --rows 1 32 64 --out gemm.json
Prints the best launch shape per (N, K, rows) in the form of skinny_gemm.TUNED.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from step.bench_attention import time_graph  # noqa: E402
from step.bench_step import measure_copy_bandwidth  # noqa: E402
from common import command_line, device_description, git_commit, markdown_table, now_iso, write_json  # noqa: E402

from higgs_serve.model.hf_config import load_model_spec  # noqa: E402
from higgs_serve.model.fused_ops import TritonOps  # noqa: E402
from higgs_serve.model.skinny_gemm import SkinnyConfig, config_for, row_block, skinny_linear  # noqa: E402

logger = logging.getLogger("bench_gemm")


def layer_shapes(model_dir: str) -> dict[str, tuple[int, int, bool]]:
    """name -> (N, K, has_residual) of the four per-layer GEMMs."""
    text = load_model_spec(model_dir).text
    d, i = text.hidden_size, text.intermediate_size
    return {"qkv": (text.q_size + 2 * text.kv_size, d, False), "o": (d, text.q_size, True),
            "gate_up": (2 * i, d, False), "down": (d, i, True)}


def candidates(n: int, k: int, rows: int) -> list[SkinnyConfig]:
    if rows > 16:
        return wide_candidates(n, k, rows)
    out = []
    for block_n, block_k, split, stages in itertools.product((32, 64, 128), (128, 256), (1, 2, 4, 8, 16), (3, 5)):
        cfg = SkinnyConfig(block_n, block_k, split, num_warps=4, num_stages=stages)
        programs = (n // block_n) * split
        if cfg.fits(n, k) and 128 <= programs <= 1200:
            out.append(cfg)
    return out


def wide_candidates(n: int, k: int, rows: int) -> list[SkinnyConfig]:
    """Past 16 rows the x tile [K block, rows] is as large as the weight tile, so shared memory per
    stage, not the weight stream, sets how many programs an SM holds: shallower K tiles and fewer
    stages are in the space (what found the 32- and 64-row buckets of skinny_gemm.TUNED)."""
    out = []
    for block_n, block_k, split, stages, warps in itertools.product((32, 64, 128), (64, 128), (1, 2, 4, 8),
                                                                    (2, 3, 4), (4, 8)):
        cfg = SkinnyConfig(block_n, block_k, split, num_warps=warps, num_stages=stages)
        smem = stages * (block_n + row_block(rows)) * block_k * 2
        programs = (n // block_n) * split
        if cfg.fits(n, k) and smem <= 220 * 1024 and 100 <= programs <= 2000 and k // split // block_k >= 2:
            out.append(cfg)
    return out


def swiglu_candidates(n: int, k: int) -> list[SkinnyConfig]:
    """Launch shapes of the SwiGLU epilogue for a [gate; up] weight [n, k] (whole sums: no split)."""
    return [cfg for block_n, block_k, stages, warps in itertools.product((32, 64), (64, 128), (3, 4, 5), (4, 8))
            if (cfg := SkinnyConfig(block_n, block_k, 1, num_warps=warps, num_stages=stages)).fits(n // 2, k)]


def sweep(cands: list[SkinnyConfig], run, ref: torch.Tensor, args) -> list[dict]:
    """Each launch shape's max error against ref and its time per call of run(layer, cfg), fastest
    first; shapes the compiler rejects (shared memory) are skipped."""
    results = []
    for cfg in cands:
        try:
            err = (run(0, cfg).float() - ref).abs().max().item()
            t = time_layers(lambda i: run(i, cfg), args.layers, args.iters)
        except Exception as exc:
            logger.info("%s failed: %s", cfg, str(exc).splitlines()[0][:120])
            continue
        results.append({"config": cfg.__dict__, "us": t * 1e6, "max_err": err})
    return sorted(results, key=lambda r: r["us"])


def time_layers(fn, layers: int, iters: int) -> float:
    """Seconds per call of fn(layer) inside one captured graph of `layers` calls (one weight each)."""
    return time_graph(lambda: [fn(layer) for layer in range(layers)], iters) / layers


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 32, 64])
    p.add_argument("--shapes", nargs="+", default=None, help="subset of qkv o gate_up down")
    p.add_argument("--layers", type=int, default=36, help="distinct weight copies per timing")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--max-configs", type=int, default=0, help="cap candidates per point (0 = all)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(message)s")
    device = torch.device("cuda")
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count
    bandwidth = measure_copy_bandwidth(device, 2 << 30)
    shapes = layer_shapes(args.model)
    rows_out: list[dict] = []
    best: dict[str, dict] = {}
    for name in args.shapes or list(shapes):
        n, k, has_residual = shapes[name]
        weights = [torch.randn(n, k, device=device, dtype=torch.bfloat16) * k ** -0.5 for _ in range(args.layers)]
        floor_s = n * k * 2 / bandwidth
        for m in args.rows:
            x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
            residual = torch.randn(m, n, device=device, dtype=torch.bfloat16) if has_residual else None
            ref = x.float() @ weights[0].float().t() + (residual.float() if has_residual else 0)
            if has_residual:
                cublas = time_layers(lambda i: torch.addmm(residual, x, weights[i].t()), args.layers, args.iters)
            else:
                cublas = time_layers(lambda i: F.linear(x, weights[i]), args.layers, args.iters)
            point = {"shape": name, "n": n, "k": k, "rows": m, "floor_us": floor_s * 1e6, "cublas_us": cublas * 1e6,
                     "default": str(config_for(m, n, k, num_sms))}
            cands = candidates(n, k, m)[: args.max_configs or None]
            results = sweep(cands, lambda i, cfg: skinny_linear(x, weights[i], residual, cfg), ref, args)
            if name == "gate_up":  # the SwiGLU epilogue against cuBLAS + the SiLU-and-multiply kernel
                gate, up = ref[:, : n // 2], ref[:, n // 2:]
                fused = sweep(swiglu_candidates(n, k)[: args.max_configs or None],
                              lambda i, cfg: skinny_linear(x, weights[i], None, cfg, swiglu=True),
                              F.silu(gate) * up, args)
                two = time_layers(lambda i: TritonOps.silu_mul(F.linear(x, weights[i])), args.layers, args.iters)
                point.update(cublas_silu_mul_us=two * 1e6, swiglu_top5=fused[:5])
            if results:
                top = results[0]
                point.update(best_us=top["us"], best_config=top["config"], best_err=top["max_err"],
                             best_vs_cublas=cublas * 1e6 / top["us"], best_of_floor=floor_s / (top["us"] * 1e-6),
                             cublas_of_floor=floor_s / cublas, top5=results[:5])
                best[f"{name}:{m}"] = top["config"]
            logger.info("%s N=%d K=%d M=%d: cublas %.1f us, best %s us %s (floor %.1f us)", name, n, k, m,
                        cublas * 1e6, f"{point.get('best_us', 0):.1f}", point.get("best_config"), floor_s * 1e6)
            rows_out.append(point)
        weights.clear()  # free the copies before the next shape
        torch.cuda.empty_cache()
    result = {"tool": "bench_gemm", "command": command_line(), "git_commit": git_commit(),
              "device": {**device_description(), "torch": torch.__version__,
                         "cuda_name": torch.cuda.get_device_name(device)},
              "finished_at": now_iso(), "copy_bandwidth_gbps": bandwidth / 1e9, "num_sms": num_sms,
              "layers": args.layers, "rows": rows_out, "best": best}
    if args.out:
        write_json(args.out, result)
    print(markdown_table(rows_out, [("shape", "GEMM"), ("rows", "M"), ("floor_us", "floor us"),
                                    ("cublas_us", "cuBLAS us"), ("best_us", "skinny us"),
                                    ("best_vs_cublas", "speed-up"), ("cublas_of_floor", "cuBLAS / floor"),
                                    ("best_of_floor", "skinny / floor"), ("best_config", "launch shape")]))
    print(json.dumps(best))
    return 0


if __name__ == "__main__":
    sys.exit(main())
