"""The server's event-loop CPU per audio second for responses encoded in encoder processes
(issue 54 item 3): what moving the audio to the processes costs the process that runs the
engine's loop.

K responses run at once on this process's asyncio loop, each through its own `AudioOut` over
an `EncodePool`, exactly as the server runs them (server/last_mile/audio_out.py). They advance in
engine-like steps: each step hands every response one chunk of `--chunk-s` seconds (as one
engine step makes a chunk for every running request), the responses push it to their process
and await the bytes; the next step starts when all have them. This process does nothing else,
so its CPU (getrusage: the loop's thread, the only busy one) over the run, divided by the audio
seconds encoded, is the loop's cost per audio second; the encoder processes' CPU
(/proc/PID/stat) is reported beside it.

Cases: flac and mp3 at the model's rate, speed 1 (since issue 54 sent as int16, several
responses' chunks per socket write), and mp3 at 48 kHz (resampled in the process, still
float32: the control). Run it at two commits to compare (results/README.md names them).

    PYTHONPATH=src python benchmarks/last_mile/bench_encode_loop.py --out benchmarks/results/encode_loop_cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from common import markdown_table, now_iso, provenance, write_json  # noqa: E402
from last_mile.bench_encode_gil import children_cpu_s  # noqa: E402
from last_mile.bench_encoders import speech_audio  # noqa: E402

from higgs_serve.server.last_mile.audio_out import AudioOut  # noqa: E402
from higgs_serve.server.last_mile.encode_pool import EncodePool  # noqa: E402

MODEL_RATE_HZ = 24000
CASES = {"flac": ("flac", 24000), "mp3": ("mp3", 24000), "mp3_48k": ("mp3", 48000)}


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def run_case(pool: EncodePool, fmt: str, rate_hz: int, streams: int, steps: int,
                   chunk_s: float, audio: np.ndarray) -> dict:
    chunk = int(chunk_s * MODEL_RATE_HZ)
    outs = [AudioOut(fmt, MODEL_RATE_HZ, rate_hz, 1.0, pool) for _ in range(streams)]
    offsets = [(i * 7919) % (audio.size - chunk * steps) for i in range(streams)]
    cpu0, kids0, wall0 = own_cpu_s(), children_cpu_s(pool.pids()), time.perf_counter()
    try:
        for step in range(steps):
            last = step == steps - 1
            pieces = [audio[o + step * chunk:o + (step + 1) * chunk] for o in offsets]
            await asyncio.gather(*(out.close(p) if last else out.push(p) for out, p in zip(outs, pieces)))
    finally:
        for out in outs:
            out.release()
    wall, cpu = time.perf_counter() - wall0, own_cpu_s() - cpu0
    audio_s = streams * steps * chunk_s
    return {"format": fmt, "rate_hz": rate_hz, "streams": streams, "audio_s": audio_s,
            "wall_s": round(wall, 3), "audio_s_per_s": round(audio_s / wall, 1),
            "loop_cpu_ms_per_audio_s": round(1e3 * cpu / audio_s, 4),
            "encoder_cpu_ms_per_audio_s": round(1e3 * (children_cpu_s(pool.pids()) - kids0) / audio_s, 3)}


async def main_async(args: argparse.Namespace) -> list[dict]:
    audio, _ = speech_audio(30.0)
    pool = EncodePool(args.processes)
    await pool.start()
    rows = []
    try:
        for name in args.cases:
            fmt, rate_hz = CASES[name]
            for streams in args.streams:
                await run_case(pool, fmt, rate_hz, streams, 2, args.chunk_s, audio)  # warm
                runs = [await run_case(pool, fmt, rate_hz, streams, args.steps, args.chunk_s, audio)
                        for _ in range(args.repeats)]
                best = min(runs, key=lambda r: r["loop_cpu_ms_per_audio_s"])
                rows.append({**best, "case": name,
                             "loop_cpu_ms_per_audio_s_runs": [r["loop_cpu_ms_per_audio_s"] for r in runs]})
                print(name, streams, f"loop {best['loop_cpu_ms_per_audio_s']:.3f} CPU-ms/audio-s",
                      flush=True)
    finally:
        await pool.shutdown()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--streams", nargs="+", type=int, default=[64, 256])
    parser.add_argument("--steps", type=int, default=10, help="chunks per response")
    parser.add_argument("--chunk-s", type=float, default=0.2)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="the least loop CPU of these is kept")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    started, load_before = now_iso(), os.getloadavg()
    rows = asyncio.run(main_async(args))
    print(markdown_table(rows, [("case", "case"), ("streams", "K"), ("audio_s_per_s", "audio-s/s"),
                                ("loop_cpu_ms_per_audio_s", "loop CPU ms/audio-s"),
                                ("encoder_cpu_ms_per_audio_s", "encoders CPU ms/audio-s")]))
    if args.out:
        write_json(args.out, {**provenance("bench_encode_loop", started), "settings": vars(args),
                              "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                              "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
