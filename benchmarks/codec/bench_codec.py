"""Stage 1 codec cost: batched window decode time and throughput per precision and decode path,
with the error of each against a float64 decode of the same codes (real geometry, random weights).

Paths (`--paths`):
  torch  eager decode with the plain-torch Snake (five kernels per Snake; the old eager path)
  eager  eager decode with the fused Triton Snake (what the decoder uses on CUDA)
  graph  the fused-Snake decoder replayed as one CUDA graph per (window, batch), as the codec
         runner does after start-up (Stage 1 enforce_eager: false); times replay + the static
         input copy. CUDA only (skipped elsewhere).

Windows (`--window`, frames) default to the steady-state streaming window (L + C + H = 54 frames,
25 new). "audio s/s" counts only the new frames each window contributes, as in serving: by
default 25 for a 54-frame window and max(1, T - 29) for a T-frame one (L + H = 29 frames of
context; the 5-frame first window adds 1), or `--new-frames` (one value, or one per window).
`--keep new` (the runner's way) decodes only what a window's new frames need (they end
`--holdback` frames before the window's end); `--keep window` decodes the whole window and cuts
after, as the runner did before; both run side by side when given both.

  PYTHONPATH=src python3 benchmarks/codec/bench_codec.py --model /tmp/h4b --out codec.json
  PYTHONPATH=src python3 benchmarks/codec/bench_codec.py --model /tmp/h4b --batch 1 16 64 --window 5 54 \\
      --paths torch eager graph --iters 4 --out codec.json
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from common import command_line, device_description, git_commit, markdown_table, now_iso, write_json  # noqa: E402

from higgs_serve.codec.chunker import WindowShape  # noqa: E402
from higgs_serve.codec.codec_graphs import CodecGraphs  # noqa: E402
from higgs_serve.codec.decoder import PRECISION_DTYPES, SPLIT_CONV_MIN_CHANNELS, CodecDecoder  # noqa: E402
from higgs_serve.codec.snake import snake  # noqa: E402
from higgs_serve.model.hf_config import load_model_spec  # noqa: E402
from higgs_serve.model.tiny import build_dummy_tensors  # noqa: E402

PRECISIONS = ("float32", "bf16x3", "tf32", "bfloat16")
PATHS = ("torch", "eager", "graph")
ERR_BATCH = 4  # windows compared against the float64 decode
CONTEXT_FRAMES = 29  # L + H of the default streaming window (docs/model.md#streaming-windows)


def build_decoder(spec, tensors, precision: str, device: torch.device, gemm_convs: bool = True) -> CodecDecoder:
    """The decoder as the engine builds it for `precision` (`gemm_convs` False: every k7 conv on
    cuDNN, as before the float32 GEMM form)."""
    dtype = torch.float64 if precision == "float64" else PRECISION_DTYPES[precision]
    dec = CodecDecoder(spec.codec).to(device=device, dtype=dtype)
    dec.load_state({k: v.to(device=device, dtype=dtype) for k, v in tensors.items()})
    if precision != "float64":
        dec.use_precision(precision)
    if not gemm_convs:
        dec.gemm_conv_min_channels = None
    return dec.eval()


def _time(fn, iters: int, device: torch.device) -> float:
    for _ in range(2):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) / iters


def _new_frames(windows: list[int], given: list[int] | None) -> list[int]:
    if given is None:
        return [25 if w == 54 else max(1, w - CONTEXT_FRAMES) for w in windows]
    if len(given) == 1:
        return given * len(windows)
    if len(given) != len(windows):
        raise SystemExit(f"--new-frames takes one value or one per window ({len(windows)}), got {len(given)}")
    return given


def window_shape(frames: int, new_frames: int, holdback: int, keep: str) -> WindowShape:
    """`keep` "new": the window's new frames, which end `holdback` frames before its end (at most
    the window); "window": all of it."""
    if keep == "window":
        return WindowShape(frames, 0, frames)
    end = max(min(new_frames, frames), frames - holdback)
    return WindowShape(frames, max(0, end - new_frames), end)


def _decode_fn(path: str, dec: CodecDecoder, graphs: CodecGraphs | None, codes: torch.Tensor, shape: WindowShape):
    """The call one path times: codes [B, T, 8] on the device -> audio [B, kept·960]."""
    if path == "graph":
        def replay():
            with torch.cuda.stream(graphs.stream):
                audio = graphs.replay(codes, shape)
            torch.cuda.current_stream().wait_stream(graphs.stream)  # the caller reads it on this stream
            return audio
        return replay
    return lambda: dec(codes, shape.keep)


def _graphs(dec: CodecDecoder, device: torch.device, shapes: list[WindowShape], batches: list[int],
            codes: torch.Tensor, hop: int, stream: torch.cuda.Stream | None = None) -> CodecGraphs:
    """Eager warm-up of every shape (cuDNN plans, Triton compiles), then capture, as the runner
    does, on `stream` (default: a new one)."""
    stream = stream or torch.cuda.Stream(device)
    with torch.cuda.stream(stream):
        for shape in shapes:
            for b in batches:
                dec(codes[:b, :shape.frames], shape.keep)
    torch.cuda.synchronize(device)
    graphs = CodecGraphs(dec, device, stream, num_codebooks=codes.shape[-1], samples_per_frame=hop)
    stats = graphs.capture(tuple(shapes), tuple(batches))
    print(f"captured {stats['graphs']} graphs in {stats['capture_s']:.2f} s, reserved memory "
          f"{stats['pool_bytes'] / 2**20:+.0f} MiB", flush=True)
    return graphs


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="model dir (config.json is enough: random weights)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--window", "--frames", dest="windows", type=int, nargs="+", default=[54],
                    help="window lengths in frames (default 54 = L + C + H)")
    ap.add_argument("--new-frames", type=int, nargs="+", default=None,
                    help="frames each window adds to the stream (one, or one per window)")
    ap.add_argument("--keep", nargs="+", choices=["new", "window"], default=["new"],
                    help="decode only what the new frames need (the runner) or the whole window")
    ap.add_argument("--holdback", type=int, default=4, help="frames after a window's new ones (H)")
    ap.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    ap.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    ap.add_argument("--gemm-convs", nargs="+", choices=["on", "off"], default=["on"],
                    help="float32: wide k7 convs as a GEMM (on, the decoder's default) or all on cuDNN (off)")
    ap.add_argument("--split-min-channels", type=int, nargs="+", default=[SPLIT_CONV_MIN_CHANNELS],
                    help="bf16x3: split the residual units of this many channels and more (one row set per value)")
    ap.add_argument("--cudnn-benchmark", nargs="+", choices=["off", "on"], default=["off"],
                    help="torch.backends.cudnn.benchmark (cuDNN times its algorithms per shape at the first call); "
                         "both values run side by side")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    device = torch.device(args.device)
    new_frames = _new_frames(args.windows, args.new_frames)
    paths = [p for p in args.paths if p != "graph" or device.type == "cuda"]
    if paths != args.paths:
        print("graph path skipped: CUDA graphs need a CUDA device", flush=True)
    spec = load_model_spec(Path(args.model))
    hop = spec.codec.hop_length
    _, codec_tensors = build_dummy_tensors(spec, dtype=torch.float32, device="cpu", seed=0)
    gen = torch.Generator().manual_seed(0)
    err_batch = min(ERR_BATCH, max(args.batch))
    codes = torch.randint(0, 1024, (max(args.batch), max(args.windows), 8), generator=gen).to(device)
    ref64 = build_decoder(spec, codec_tensors, "float64", device)
    references = {w: ref64(codes[:err_batch, :w]).double() for w in args.windows}
    del ref64
    shapes = [window_shape(w, new, args.holdback, keep) for keep in args.keep for w, new in zip(args.windows, new_frames)]
    rows = []
    variants = [(precision, tuned, gemm, split)
                for precision, tuned, gemm in itertools.product(args.precisions, args.cudnn_benchmark, args.gemm_convs)
                for split in (args.split_min_channels if precision == "bf16x3" else [None])]
    for precision, tuned, gemm, split in variants:
        if gemm == "off" and precision != "float32" and "on" in args.gemm_convs:
            continue  # the GEMM form is float32's only: one row per other precision
        torch.backends.cudnn.benchmark = tuned == "on"
        torch.backends.cudnn.allow_tf32 = precision == "tf32"
        dec = build_decoder(spec, codec_tensors, precision, device, gemm == "on")
        if split is not None:
            dec.split_conv_min_channels = split
        label = precision if split is None else f"{precision}>={split}"
        fused_snake = dec.snake
        for path in paths:
            dec.snake = snake if path == "torch" else fused_snake
            graphs = None
            if path == "graph":
                graphs = _graphs(dec, device, shapes, sorted({*args.batch, err_batch}), codes, hop)
            for shape, new in zip(shapes, new_frames * len(args.keep)):
                w = shape.frames
                reference = references[w][:, shape.keep_start * hop : shape.keep_end * hop]
                peak = reference.abs().max().item()
                err = (_decode_fn(path, dec, graphs, codes[:err_batch, :w], shape)().double() - reference).abs().max().item()
                keep = "window" if shape.keep == (0, w) else "new"
                for b in args.batch:
                    seconds = _time(_decode_fn(path, dec, graphs, codes[:b, :w], shape), args.iters, device)
                    audio_s = b * new / spec.codec.frame_rate
                    rows.append({"precision": precision, "split_min_channels": split, "cudnn_benchmark": tuned, "gemm_convs": gemm, "path": path,
                                 "window_frames": w, "new_frames": new, "keep": keep, "keep_frames": list(shape.keep),
                                 "batch": b, "ms_per_call": seconds * 1e3, "audio_s_per_s": audio_s / seconds,
                                 "max_abs_err_vs_fp64": err, "err_rel_peak": err / peak})
                    print(f"{label:13s} cudnn-bench {tuned:3s} gemm {gemm:3s} {path:5s} T={w:3d} keep {keep:6s} B={b:3d} {seconds * 1e3:8.2f} ms  "
                          f"{audio_s / seconds:8.1f} audio s/s  err {err:.2e} ({err / peak:.1e} of peak)", flush=True)
            del graphs
            if device.type == "cuda":
                torch.cuda.empty_cache()
        del dec
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    table = markdown_table(rows, [("precision", "precision"), ("split_min_channels", "split from channels"), ("cudnn_benchmark", "cuDNN benchmark"), ("gemm_convs", "GEMM convs"), ("path", "path"), ("window_frames", "window"), ("keep", "keep"),
                                  ("batch", "batch"), ("ms_per_call", "ms/call"), ("audio_s_per_s", "audio s/s"),
                                  ("err_rel_peak", "max err / peak")])
    print(table)
    if args.out:
        single = len(args.windows) == 1  # one window: the scalar fields of earlier results files
        write_json(args.out, {"command": command_line(), "git_commit": git_commit(), "device": device_description(),
                              "time": now_iso(), "window_frames": args.windows[0] if single else args.windows,
                              "new_frames": new_frames[0] if single else new_frames, "paths": paths,
                              "rows": rows})


if __name__ == "__main__":
    main()
