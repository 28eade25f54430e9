"""The codec's residual units on the tensor cores at float32-class precision (`codec/conv_split.py`:
tf32x3 and bf16x3 split operands) against cuDNN float32, cuDNN TF32 and the im2col SGEMM the
decoder uses for 256+ channels, per decoder stage at the streaming batch (64 windows of 39
frames). Two tables: each conv alone (ms per call at the best launch shape of a small sweep, max
error against a float64 conv relative to its peak), and whole residual units as the decoder runs
them (Snake, k7 conv, Snake, k1 conv, skip).

  python3 benchmarks/bench_conv_split.py [--out conv_split.json]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import command_line, device_description, git_commit, now_iso, write_json  # noqa: E402

from higgs_serve.codec.conv_split import (LaunchShape, conv1d_tc, launch_shape, residual_unit_tc,  # noqa: E402
                                          tap_major, unit_weights)
from higgs_serve.codec.decoder import residual_unit  # noqa: E402
from higgs_serve.codec.snake import snake_triton  # noqa: E402

STAGES = [(512, 8), (256, 40), (128, 160), (64, 320), (32, 960)]  # channels, samples per frame
SHAPES = [LaunchShape(128, 128, 32, 8, 3), LaunchShape(64, 128, 32, 4, 3), LaunchShape(128, 64, 32, 4, 4),
          LaunchShape(32, 256, 32, 4, 3)]


def timeit(fn, n=5):
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3


def conv_rows(x, c, modes):
    rows = []
    for k, d in ((7, 1), (7, 9), (1, 1)):
        w = torch.randn(c, c, k, device=x.device) / (c * k) ** 0.5
        b = torch.randn(c, device=x.device)
        pad = d * (k - 1) // 2
        ref = F.conv1d(x.double(), w.double(), b.double(), padding=pad, dilation=d)
        peak = ref.abs().max().item()
        row = {"channels": c, "positions": x.shape[-1], "taps": k, "dilation": d}

        def err(y):
            return (y.double() - ref).abs().max().item() / peak

        for name, tf32 in (("cudnn_fp32", False), ("cudnn_tf32", True)):
            torch.backends.cudnn.allow_tf32 = tf32
            fn = lambda: F.conv1d(x, w, b, padding=pad, dilation=d)  # noqa: E731
            row[f"{name}_ms"], row[f"{name}_err"] = timeit(fn), err(fn())
        torch.backends.cudnn.allow_tf32 = False
        for mode in modes:
            tw = tap_major(w, b, mode)
            best = None
            for shape in SHAPES:
                if c % shape.block_out or (shape.block_out == 32 and c > 64):
                    continue
                try:
                    fn = lambda: conv1d_tc(x, tw, d, shape=shape)  # noqa: E731
                    ms = timeit(fn)
                except Exception as exc:  # a shape the compiler refuses (shared memory)
                    print(f"  {mode} {shape}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
                    continue
                if best is None or ms < best[0]:
                    best = (ms, shape, err(fn()))
            if best is not None:
                row[f"{mode}_ms"], row[f"{mode}_shape"], row[f"{mode}_err"] = best[0], list(vars(best[1]).values()), best[2]
        rows.append(row)
        print(" ".join(f"{key}={val:.3g}" if isinstance(val, float) else f"{key}={val}" for key, val in row.items()),
              flush=True)
    return rows


def unit_row(x, c, modes):
    """One residual unit (dilation 3) as the decoder runs it in float32 against the tc forms."""
    dev = x.device
    w = {"u.snake1.alpha": torch.rand(1, c, 1, device=dev) + 0.5, "u.snake2.alpha": torch.rand(1, c, 1, device=dev) + 0.5,
         "u.conv1.weight": torch.randn(c, c, 7, device=dev) / (7 * c) ** 0.5, "u.conv1.bias": torch.randn(c, device=dev),
         "u.conv2.weight": torch.randn(c, c, 1, device=dev) / c ** 0.5, "u.conv2.bias": torch.randn(c, device=dev)}
    ref = residual_unit(x.double(), {k: v.double() for k, v in w.items()}, "u", 3)
    peak = ref.abs().max().item()
    row = {"channels": c, "positions": x.shape[-1]}
    fn = lambda: residual_unit(x, w, "u", 3, snake_triton, gemm=c >= 256)  # noqa: E731
    row["shipped_ms"], row["shipped_err"] = timeit(fn), (fn().double() - ref).abs().max().item() / peak
    for mode in modes:
        u = unit_weights(w, "u", mode)
        fn = lambda: residual_unit_tc(x, u, 3)  # noqa: E731
        row[f"{mode}_ms"], row[f"{mode}_err"] = timeit(fn), (fn().double() - ref).abs().max().item() / peak
    print("unit", " ".join(f"{key}={val:.3g}" if isinstance(val, float) else f"{key}={val}" for key, val in row.items()),
          flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--frames", type=int, default=39)
    p.add_argument("--modes", nargs="+", default=["tf32x3", "bf16x3"])
    p.add_argument("--skip-convs", action="store_true", help="whole units only")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    inputs = {}
    for c, spf in STAGES:
        torch.manual_seed(0)
        inputs[c] = torch.randn(args.batch, c, args.frames * spf, device="cuda")
    units = [unit_row(x, c, args.modes) for c, x in inputs.items()]
    totals = {key: 3 * sum(u[key] for u in units) for key in units[0] if key.endswith("_ms")}
    print("all 15 residual units (ms):", {k: round(v, 2) for k, v in totals.items()}, flush=True)
    convs = [] if args.skip_convs else [row for c, x in inputs.items() for row in conv_rows(x, c, args.modes)]
    print("shipped launch shapes:", {c: list(vars(launch_shape(c)).values()) for c, _ in STAGES})
    if args.out:
        write_json(args.out, {"tool": "bench_conv_split", "command": command_line(), "git_commit": git_commit(),
                              "device": device_description(), "time": now_iso(), "units": units, "convs": convs,
                              "units_total_ms": totals})


if __name__ == "__main__":
    main()
