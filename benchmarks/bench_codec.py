"""Stage 1 codec cost: batched window decode time and throughput per precision, with the error of
each precision against a float64 decode of the same codes (real geometry, random weights).

Windows are the steady-state streaming window (L + C + H = 54 frames, 25 new frames), so
"audio s/s" counts only the new frames each window contributes, as in serving.

  PYTHONPATH=src python3 benchmarks/bench_codec.py --model /tmp/h4b --out codec.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import command_line, device_description, git_commit, markdown_table, now_iso, write_json  # noqa: E402

from higgs_serve.codec.decoder import CodecDecoder  # noqa: E402
from higgs_serve.model.hf_config import load_model_spec  # noqa: E402
from higgs_serve.model.tiny import build_dummy_tensors  # noqa: E402

PRECISIONS = ("float32", "tf32", "bfloat16")


def _decoder(spec, tensors, precision: str, device: torch.device) -> CodecDecoder:
    dtype = {"float32": torch.float32, "tf32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}[precision]
    dec = CodecDecoder(spec.codec).to(device=device, dtype=dtype)
    dec.load_state({k: v.to(device=device, dtype=dtype) for k, v in tensors.items()})
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


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="model dir (config.json is enough: random weights)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--frames", type=int, default=54, help="window length (L + C + H)")
    ap.add_argument("--new-frames", type=int, default=25, help="frames each window adds to the stream")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    device = torch.device(args.device)
    spec = load_model_spec(Path(args.model))
    _, codec_tensors = build_dummy_tensors(spec, dtype=torch.float32, device="cpu", seed=0)
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 1024, (max(args.batch), args.frames, 8), generator=gen).to(device)
    reference = _decoder(spec, codec_tensors, "float64", device)(codes[:4]).double()
    peak = reference.abs().max().item()
    rows = []
    for precision in PRECISIONS:
        torch.backends.cudnn.allow_tf32 = precision == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        dec = _decoder(spec, codec_tensors, precision, device)
        err = (dec(codes[:4]).double() - reference).abs().max().item()
        for b in args.batch:
            seconds = _time(lambda: dec(codes[:b]), args.iters, device)
            audio_s = b * args.new_frames / spec.codec.frame_rate
            rows.append({"precision": precision, "batch": b, "ms_per_call": seconds * 1e3,
                         "audio_s_per_s": audio_s / seconds, "max_abs_err_vs_fp64": err, "err_rel_peak": err / peak})
            print(f"{precision:9s} B={b:3d} {seconds * 1e3:8.2f} ms  {audio_s / seconds:8.1f} audio s/s  "
                  f"err {err:.2e} ({err / peak:.1e} of peak)", flush=True)
        del dec
    torch.backends.cudnn.allow_tf32 = False
    table = markdown_table(rows, [("precision", "precision"), ("batch", "batch"), ("ms_per_call", "ms/call"),
                                  ("audio_s_per_s", "audio s/s"), ("err_rel_peak", "max err / peak")])
    print(table)
    if args.out:
        write_json(args.out, {"command": command_line(), "git_commit": git_commit(), "device": device_description(),
                              "time": now_iso(), "window_frames": args.frames, "new_frames": args.new_frames,
                              "rows": rows})


if __name__ == "__main__":
    main()
