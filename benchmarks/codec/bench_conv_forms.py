"""The codec's residual-unit convolutions, float32, per decoder stage at the streaming batch (64
windows of 39 frames): cuDNN's conv1d against three cuBLAS formulations of the same conv, with
each one's max error against cuDNN. taps: seven accumulated batched GEMMs over shifted views;
im2col: one batched GEMM over the stacked taps; flat: one GEMM over all windows at once.

  python3 benchmarks/codec/bench_conv_forms.py
"""
import time

import torch
import torch.nn.functional as F


def timeit(fn, n=5):
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3


def taps_gemm(x, w, b, d):
    # y = bias + sum_k W_k @ x[:, :, k*d : k*d + T] on the padded input
    T, K = x.shape[-1], w.shape[-1]
    p = d * (K - 1) // 2
    xp = F.pad(x, (p, p))
    y = b[None, :, None].expand(x.shape[0], -1, T).contiguous()
    for k in range(K):
        y = torch.baddbmm(y, w[:, :, k].expand(x.shape[0], -1, -1), xp[:, :, k * d: k * d + T])
    return y


def _cols(x, K, d):
    """The stacked taps of a padded, dilated k-tap conv: [B, C*K, T]."""
    T = x.shape[-1]
    p = d * (K - 1) // 2
    xp = F.pad(x, (p, p))
    return torch.stack([xp[:, :, k * d: k * d + T] for k in range(K)], dim=2).reshape(x.shape[0], -1, T)


def im2col_gemm(x, w, b, d):
    T = x.shape[-1]
    cols = _cols(x, w.shape[-1], d)
    return torch.baddbmm(b[None, :, None].expand(x.shape[0], -1, T), w.reshape(w.shape[0], -1).expand(x.shape[0], -1, -1), cols)


def batch_flat(x, w, b, d):
    # one GEMM over all windows: [C_out, C_in*K] @ [C_in*K, B*T]
    T = x.shape[-1]
    cols = _cols(x, w.shape[-1], d)
    cols = cols.permute(1, 0, 2).reshape(cols.shape[1], -1)
    y = torch.addmm(b[:, None], w.reshape(w.shape[0], -1), cols)
    return y.reshape(w.shape[0], x.shape[0], T).permute(1, 0, 2)


def main() -> None:
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = "cuda"
    B, FR = 64, 39
    stages = [(512, 8), (256, 40), (128, 160), (64, 320), (32, 960)]  # channels, samples per frame
    tot = {}
    for c, spf in stages:
        T = FR * spf
        x = torch.randn(B, c, T, device=dev)
        for K, d in ((7, 1), (7, 3), (7, 9), (1, 1)):
            w = torch.randn(c, c, K, device=dev) / (c * K) ** 0.5
            b = torch.randn(c, device=dev)
            ref = F.conv1d(x, w, b, padding=d * (K - 1) // 2, dilation=d)
            row = {"cudnn": timeit(lambda: F.conv1d(x, w, b, padding=d * (K - 1) // 2, dilation=d))}
            for name, fn in (("taps", taps_gemm), ("im2col", im2col_gemm), ("flat", batch_flat)):
                try:
                    err = (fn(x, w, b, d) - ref).abs().max().item()
                    row[name] = timeit(lambda: fn(x, w, b, d))
                    row[name + "_err"] = err
                except Exception as e:
                    row[name] = float("nan")
                    print(name, e)
            for k2, v in row.items():
                if not k2.endswith("_err"):
                    tot[k2] = tot.get(k2, 0) + v
            flops = 2 * B * c * c * K * T
            print(f"C={c:4d} T={T:6d} K={K} d={d}: " + "  ".join(f"{k2} {v:.3g}" for k2, v in row.items()) + f"   cudnn {flops / row['cudnn'] / 1e9:.1f} TFLOP/s", flush=True)
    print("totals (ms, one of each conv per stage):", {k: round(v, 2) for k, v in tot.items()})


if __name__ == "__main__":
    main()
