"""Stage 1 precision error as SNR (issue 33 item 2): how far the opt-in codec precisions "bf16x3"
and "tf32" (and "bfloat16", for contrast) move the audio away from the float32 decode, and how far
float32 is from a float64 decode, over random-weight codecs at the model's codec geometry.

Per seed: the codec weights `--load-format dummy` builds with that seed (seed 0 gives the server's
own dummy codec; with `--load-format auto` every seed uses the checkpoint's weights and varies
only the codes), `--windows` code windows of the steady streaming shape (L + C + H = 54 frames of
which the runner keeps frames 25..50 and decodes only what those need) and CLIPS_PER_LENGTH whole
clips of each of CLIP_FRAMES, decoded in one call. Codes are uniform in [0, codebook_size). Every
window is decoded in float64, float32 and each precision, the decoder built as bench_codec builds
it and cuDNN's TF32 switch on for "tf32" only, as engine/builder.py sets it (the switch covers
convolutions; the few linear layers stay float32, as in the server).

Per window: SNR = 10·log10(Σ ref² / Σ (out − ref)²) dB, ref the float32 decode (float64 for the
float32 row), and max |out − ref| / max |ref|. Rows give the mean (over windows, in dB), the
minimum and the 5th percentile. For scale ("16-bit SNR"): the SNR of the same float32 output
scaled to full scale (peak 1.0) and put through the server's 16-bit PCM conversion (`pcm16`):
the best 16-bit PCM can do for that waveform, ~98 dB for a sine, less for a higher crest factor.
The JSON also has it at the output's own level, as the server sends it ("pcm16_snr_*"; random
weights set that level, and a peak past 1.0 clips). Verdict: "transparent" when the smallest SNR
is at least 90 dB, an error no louder than the 16-bit quantisation of a full-scale signal. A
window decoded bit-identically has infinite SNR: counted as identical and left out of the mean
and percentile. On CPU there is no TF32: the "tf32" row is plain float32 there.

  PYTHONPATH=src python3 benchmarks/codec/bench_codec_snr.py --model /tmp/h4b --out codec_snr.json
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from codec.bench_codec import build_decoder  # noqa: E402
from common import command_line, device_description, git_commit, markdown_table, now_iso, write_json  # noqa: E402

from higgs_serve.codec.chunker import WindowParams  # noqa: E402
from higgs_serve.codec.weights import expected_decoder_tensors  # noqa: E402
from higgs_serve.model.checkpoint import load_checkpoint, resolve_model_dir  # noqa: E402
from higgs_serve.model.hf_config import load_model_spec  # noqa: E402
from higgs_serve.model.tiny import build_dummy_tensors  # noqa: E402

# Each precision's row and the decode it is measured against.
REFERENCE = {"float32": "float64", "bf16x3": "float32", "tf32": "float32", "bfloat16": "float32"}
TRANSPARENT_DB = 90.0
CLIP_FRAMES = (75, 250)  # whole 3 s and 10 s clips, one decode call each
CLIPS_PER_LENGTH = 2
BATCH = 64  # windows per decode call
TF32_CPU_NOTE = "no TF32 on CPU: float32 arithmetic"


@dataclass(frozen=True)
class Case:
    """One kind of window: codes [N, T, Q] and the frames kept (None: all)."""

    name: str
    codes: torch.Tensor
    keep: tuple[int, int] | None


def cases(spec, seed: int, windows: int) -> list[Case]:
    """The seed's code windows: `windows` of the steady streaming shape, then the whole clips."""
    p = WindowParams()
    frames = p.left_context_frames + p.chunk_frames + p.right_holdback_frames
    keep = (p.left_context_frames, p.left_context_frames + p.chunk_frames)
    gen = torch.Generator().manual_seed(seed)
    q, size = spec.codec.num_quantizers, spec.codec.codebook_size
    stream = torch.randint(0, size, (windows, frames, q), generator=gen)
    out = [Case(f"stream {frames} keep {keep[0]}-{keep[1]}", stream, keep)]
    for length in CLIP_FRAMES:
        out.append(Case(f"clip {length}", torch.randint(0, size, (CLIPS_PER_LENGTH, length, q), generator=gen), None))
    return out


def codec_tensors(spec, model_dir: Path, load_format: str, seed: int, device: torch.device) -> dict[str, torch.Tensor]:
    """The decoder's float32 tensors: the dummy ones of `seed` (generated as the engine does, on
    the device, talker first) or the checkpoint's."""
    if load_format == "dummy":
        tensors = build_dummy_tensors(spec, dtype=torch.bfloat16, device=device, seed=seed).codec
    else:
        tensors = load_checkpoint(model_dir, spec).codec
    return {name: tensors[name].float() for name in expected_decoder_tensors(spec.codec)}


def decode_all(spec, tensors, precision: str, all_cases: list[Case], device: torch.device) -> dict[str, np.ndarray]:
    """Every case decoded at `precision` -> float64 audio [N, samples] per case name."""
    torch.backends.cudnn.allow_tf32 = precision == "tf32"  # process-wide, as the engine builder sets it
    try:
        dec = build_decoder(spec, tensors, precision, device)
        out = {}
        for case in all_cases:
            parts = [dec(case.codes[i : i + BATCH].to(device), case.keep).double().cpu().numpy()
                     for i in range(0, len(case.codes), BATCH)]
            out[case.name] = np.concatenate(parts)
        return out
    finally:
        torch.backends.cudnn.allow_tf32 = False


def snr_db(out: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Per window [N]: 10·log10(Σ ref² / Σ (out − ref)²); inf where out == ref."""
    noise = np.square(out - ref).sum(axis=1)
    with np.errstate(divide="ignore"):
        return 10.0 * np.log10(np.square(ref).sum(axis=1) / noise)


def rel_err(out: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Per window [N]: max |out − ref| / max |ref|."""
    return np.abs(out - ref).max(axis=1) / np.abs(ref).max(axis=1)


def pcm16(audio: np.ndarray) -> np.ndarray:
    """audio after the server's 16-bit PCM conversion (audio/formats.float_to_int16: clip to ±1,
    ×32767, round; restated because that module needs soundfile, which the GPU image lacks, and a
    unit test holds the two equal) and back to float."""
    clipped = np.clip(audio.astype(np.float32), -1.0, 1.0)
    return (clipped * 32767.0).round().astype(np.int16).astype(np.float64) / 32767.0


def pcm16_snrs(ref32: np.ndarray) -> dict[str, np.ndarray]:
    """16-bit PCM SNR of the float32 output per window: as sent, and scaled to peak 1.0 first."""
    full = ref32 / np.maximum(np.abs(ref32).max(axis=1, keepdims=True), np.finfo(np.float64).tiny)
    return {"sent": snr_db(pcm16(ref32), ref32), "full_scale": snr_db(pcm16(full), full),
            "peak": np.abs(ref32).max(axis=1)}


def measure_seed(decoded: dict[str, dict[str, np.ndarray]], names: list[str]) -> dict:
    """Per (precision, case): SNR against its reference and against float64, relative error;
    per case: the float32 output's 16-bit PCM SNRs."""
    per = {}
    for precision, reference in REFERENCE.items():
        for name in names:
            out, ref = decoded[precision][name], decoded[reference][name]
            per[precision, name] = {"snr": snr_db(out, ref), "snr64": snr_db(out, decoded["float64"][name]),
                                    "rel": rel_err(out, ref)}
    pcm = {name: pcm16_snrs(decoded["float32"][name]) for name in names}
    return {"per": per, "pcm": pcm}


def _finite(values: np.ndarray) -> np.ndarray:
    return values[np.isfinite(values)]


def summary(precision: str, scope: str, parts: list[dict], pcm: list[dict], cpu: bool) -> dict:
    """One table row from per-window arrays (of one case or all cases, every seed)."""
    snr = np.concatenate([p["snr"] for p in parts])
    snr64 = _finite(np.concatenate([p["snr64"] for p in parts]))
    finite = _finite(snr)
    sent = _finite(np.concatenate([p["sent"] for p in pcm]))
    full = _finite(np.concatenate([p["full_scale"] for p in pcm]))
    worst = float(finite.min()) if finite.size else None
    row = {"precision": precision, "reference": REFERENCE[precision], "scope": scope, "windows": int(snr.size),
           "identical_windows": int(snr.size - finite.size),
           "snr_mean_db": float(finite.mean()) if finite.size else None, "snr_min_db": worst,
           "snr_p5_db": float(np.percentile(finite, 5)) if finite.size else None,
           "max_err_rel_peak": float(np.concatenate([p["rel"] for p in parts]).max()),
           "snr_vs_float64_min_db": float(snr64.min()) if snr64.size else None,
           "pcm16_snr_mean_db": float(sent.mean()), "pcm16_snr_min_db": float(sent.min()),
           "pcm16_full_scale_snr_mean_db": float(full.mean()), "pcm16_full_scale_snr_min_db": float(full.min()),
           "float32_peak_max": float(np.concatenate([p["peak"] for p in pcm]).max()),
           "verdict": "transparent" if worst is None or worst >= TRANSPARENT_DB else "not transparent"}
    if precision == "tf32" and cpu:
        row["note"] = TF32_CPU_NOTE
    return row


def tables(seeds: list[dict], names: list[str], cpu: bool) -> tuple[list[dict], list[dict]]:
    """(rows over every window, one per precision; rows per precision and case)."""
    rows, by_case = [], []
    for precision in REFERENCE:
        for name in names:
            by_case.append(summary(precision, name, [s["per"][precision, name] for s in seeds],
                                   [s["pcm"][name] for s in seeds], cpu))
        rows.append(summary(precision, "all", [s["per"][precision, n] for s in seeds for n in names],
                            [s["pcm"][n] for s in seeds for n in names], cpu))
    return rows, by_case


COLUMNS = [("precision", "precision"), ("reference", "vs"), ("scope", "windows of"), ("windows", "windows"),
           ("snr_mean_db", "SNR mean dB"), ("snr_min_db", "SNR min dB"), ("snr_p5_db", "SNR p5 dB"),
           ("max_err_rel_peak", "max err / peak"), ("snr_vs_float64_min_db", "SNR vs float64 min dB"),
           ("pcm16_full_scale_snr_mean_db", "16-bit SNR mean dB"), ("pcm16_full_scale_snr_min_db", "16-bit SNR min dB"),
           ("verdict", "verdict"), ("note", "note")]


def _db(value: float | None) -> str:
    return "identical" if value is None else f"{value:.1f}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="model dir (config.json is enough with --load-format dummy)")
    p.add_argument("--load-format", choices=["auto", "dummy"], default="dummy")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seeds", type=int, default=4, help="random codecs (dummy weights of seeds 0..N-1)")
    p.add_argument("--windows", type=int, default=64, help="streaming windows per seed")
    p.add_argument("--out", default=None, help="JSON file (rewritten after every seed)")
    args = p.parse_args(argv)
    if args.seeds < 1 or args.windows < 1:
        p.error(f"--seeds and --windows must be >= 1, got {args.seeds} and {args.windows}")
    return args


@torch.inference_mode()
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    cpu = device.type != "cuda"
    model_dir = resolve_model_dir(args.model)
    spec = load_model_spec(model_dir)
    t0 = time.perf_counter()
    seeds, names = [], []
    for seed in range(args.seeds):
        tensors = codec_tensors(spec, model_dir, args.load_format, seed, device)
        seed_cases = cases(spec, seed, args.windows)
        names = [c.name for c in seed_cases]
        decoded = {precision: decode_all(spec, tensors, precision, seed_cases, device)
                   for precision in ("float64", *REFERENCE)}
        seeds.append(measure_seed(decoded, names))
        del tensors, decoded
        rows, by_case = tables(seeds, names, cpu)
        print(f"seed {seed} done at {time.perf_counter() - t0:.1f} s; SNR min so far, dB: "
              + ", ".join(f"{r['precision']} {_db(r['snr_min_db'])}" for r in rows), flush=True)
        if args.out:
            write_json(args.out, {
                "command": command_line(f"benchmarks/codec/{Path(__file__).name}", argv), "git_commit": git_commit(), "device": device_description(),
                "torch_device": str(device), "time": now_iso(), "model": args.model, "load_format": args.load_format,
                "seeds": args.seeds, "seeds_done": seed + 1, "windows": args.windows,
                "clips": {"frames": list(CLIP_FRAMES), "per_length": CLIPS_PER_LENGTH},
                "transparent_db": TRANSPARENT_DB, "elapsed_s": time.perf_counter() - t0,
                "notes": [TF32_CPU_NOTE] if cpu else [], "rows": rows, "by_case": by_case})
    if cpu:
        print(f"tf32: {TF32_CPU_NOTE} (its row equals float32)")
    print(markdown_table(by_case, COLUMNS))
    print()
    print(markdown_table(rows, COLUMNS))


if __name__ == "__main__":
    main()
