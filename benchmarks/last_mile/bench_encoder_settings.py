"""Cheaper encoder settings, where quality allows: CPU per audio second against PESQ-WB for the
knobs PyAV exposes on the compressed formats, at the server's bit rates (audio/encoders).

- mp3 (libmp3lame, 64 kbit/s): `compression_level` 0-9 (LAME's -q: 0 best and slowest; FFmpeg
  leaves LAME's own default when unset, the server's current setting, "default" below);
- opus (libopus, 32 kbit/s, 40 ms frames as the server's): `compression_level` 0-10 (libopus
  complexity; 10 is FFmpeg's default and the server's);
- aac (FFmpeg's native encoder, 64 kbit/s): `aac_coder` twoloop (default) or fast.

Each setting encodes the same real speech (espeak-ng sentences, benchmarks/speech_clips.py,
24 kHz), whole, in one thread, timed with that thread's CPU clock (best of --repeats); the file
is decoded by PyAV, aligned to the source by cross-correlation (codec delay) and scored with
PESQ wide-band (the `pesq` package, ITU-T P.862.2) at 16 kHz against the source.

    PYTHONPATH=src python benchmarks/last_mile/bench_encoder_settings.py --out benchmarks/results/encoder_settings_cpu.json
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from pathlib import Path

import av
import numpy as np
import soxr
from pesq import pesq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from common import markdown_table, now_iso, provenance, write_json  # noqa: E402
from speech_clips import make_clips  # noqa: E402

RATE_HZ = 24000
CASES = ([("mp3", "default", {})] + [("mp3", f"compression_level={q}", {"compression_level": str(q)})
                                      for q in (0, 2, 5, 7, 9)]
         + [("opus", f"compression_level={c}", {"compression_level": str(c)}) for c in (10, 8, 5, 3, 0)]
         + [("aac", "aac_coder=twoloop", {"aac_coder": "twoloop"}), ("aac", "aac_coder=fast", {"aac_coder": "fast"})])
SETUP = {"mp3": ("mp3", "libmp3lame", "s16p", 64_000), "opus": ("ogg", "libopus", "s16", 32_000),
         "aac": ("adts", "aac", "fltp", 64_000)}


def encode(fmt: str, options: dict[str, str], audio: np.ndarray) -> tuple[bytes, float]:
    """audio: [n] float32 at 24 kHz -> (the file, encoder-thread CPU seconds)."""
    container_format, codec, sample_format, bit_rate = SETUP[fmt]
    opts = dict(options)
    if fmt == "opus":
        opts["frame_duration"] = "40"
    started = time.clock_gettime(time.CLOCK_THREAD_CPUTIME_ID)
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container_format) as container:
        stream = container.add_stream(codec, rate=RATE_HZ, layout="mono", options=opts)
        stream.codec_context.bit_rate = bit_rate
        pcm = np.round(np.clip(audio, -1, 1) * 32767).astype(np.int16)
        step = RATE_HZ  # 1 s frames, as the server's steady chunks
        for at in range(0, pcm.size, step):
            piece = pcm[at:at + step]
            if sample_format == "fltp":
                frame = av.AudioFrame.from_ndarray((piece.astype(np.float32) / 32768)[None], format="fltp", layout="mono")
            else:
                frame = av.AudioFrame.from_ndarray(piece[None], format=sample_format, layout="mono")
            frame.sample_rate = RATE_HZ
            frame.pts = at
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buffer.getvalue(), time.clock_gettime(time.CLOCK_THREAD_CPUTIME_ID) - started


def decode(data: bytes) -> tuple[np.ndarray, int]:
    with av.open(io.BytesIO(data)) as container:
        chunks, rate = [], None
        for frame in container.decode(audio=0):
            rate = frame.sample_rate
            chunks.append(frame.to_ndarray().astype(np.float32).reshape(-1) if frame.format.is_planar
                          else frame.to_ndarray().astype(np.float32).reshape(-1))
        signal = np.concatenate(chunks)
    if np.abs(signal).max() > 2:  # integer samples
        signal = signal / 32768
    return signal, rate


def pesq_wb(source: np.ndarray, decoded: np.ndarray, decoded_rate: int) -> float:
    ref = soxr.resample(source, RATE_HZ, 16000)
    deg = soxr.resample(decoded, decoded_rate, 16000)
    n = min(ref.size, deg.size)
    search = 4000  # up to 250 ms of codec delay either way
    corr = np.correlate(deg[:n][: 16000 * 4], ref[:n][: 16000 * 4 - search], mode="valid")
    lag = int(np.argmax(corr))
    deg = deg[lag:lag + n]
    n = min(ref.size, deg.size)
    return float(pesq(16000, ref[:n], deg[:n], "wb"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clips", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/encoder_settings_cpu.json")
    args = parser.parse_args(argv)
    started = now_iso()
    load_before = os.getloadavg()
    clips = [c.audio for c in make_clips(args.clips)]
    seconds = sum(c.size for c in clips) / RATE_HZ
    rows = []
    for fmt, label, options in CASES:
        cpu = []
        scores = []
        for clip in clips:
            best = None
            for _ in range(args.repeats):
                data, cpu_s = encode(fmt, options, clip)
                best = cpu_s if best is None else min(best, cpu_s)
            cpu.append(best)
            scores.append(pesq_wb(clip, *decode(data)))
        rows.append({"format": fmt, "setting": label, "cpu_ms_per_audio_s": 1e3 * sum(cpu) / seconds,
                     "pesq_wb_mean": float(np.mean(scores)), "pesq_wb_min": float(np.min(scores)),
                     "kbit_s": 8 * len(data) / (clip.size / RATE_HZ) / 1e3})
        print(rows[-1], flush=True)
    write_json(args.out, {**provenance("bench_encoder_settings", started), "clips": args.clips,
                          "audio_s": seconds, "repeats": args.repeats, "loadavg_before": load_before,
                          "loadavg_after": os.getloadavg(), "rows": rows})
    print(markdown_table(rows, [("format", "format"), ("setting", "setting"),
                                ("cpu_ms_per_audio_s", "CPU ms/audio s"), ("pesq_wb_mean", "PESQ-WB mean"),
                                ("pesq_wb_min", "PESQ-WB min"), ("kbit_s", "kbit/s")]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
