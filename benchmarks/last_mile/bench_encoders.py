"""The last mile's CPU cost: what encoding each response format costs per second of audio, and how
many audio-seconds one server process encodes a second on this host (docs/api.md#formats).

Two measurements, on the same audio (real speech from eSpeak NG, benchmarks/speech_clips.py,
resampled to the model's 24 kHz and repeated to `--seconds`, recorded in the JSON):

1. Cost table. For every format, the server's per-response pipeline (server/last_mile/audio_out.py
   `AudioOut.convert`: resample to the format's default rate, the one int16 conversion, the
   incremental encoder) fed chunk by chunk in one thread, timed with that thread's CPU clock
   (CLOCK_THREAD_CPUTIME_ID, the kernel's accounting, as /proc reports it): CPU seconds per
   second of audio, at the steady chunk size (1 s, the profiles' 25 frames) and at the first
   chunks' size (40 ms), the best of `--repeats`.
2. Throughput while serving. `--streams` concurrent responses on one asyncio loop, each pushing
   1 s chunks through its own `AudioOut` exactly as the server does (codecs on the encode pool,
   `AudioWorkers`), with 1 thread and with one a core: audio-seconds encoded per wall second,
   the process's CPU (from /proc/self/stat), and the event loop's worst lag (a 5 ms ticker),
   which shows whether encoding ever blocks the loop.

From (1) the cores a GPU serving `--target-audio-s-per-s` (1,200) needs for each format:
target x CPU s per audio s, divided by the thread scaling efficiency measured in (2).

    PYTHONPATH=src python benchmarks/last_mile/bench_encoders.py --out benchmarks/results/encoders_cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from common import markdown_table, now_iso, provenance, write_json  # noqa: E402
from speech_clips import espeak, speak  # noqa: E402

from higgs_serve.audio.formats import FORMATS  # noqa: E402
from higgs_serve.server.last_mile.audio_out import AudioOut  # noqa: E402
from higgs_serve.server.last_mile.audio_workers import AudioWorkers  # noqa: E402

MODEL_RATE_HZ = 24000
SPEECH = ("The morning train to the city was late again, so everyone waited on the cold platform. "
          "She opened the old wooden box and found a stack of letters tied with a blue ribbon. "
          "Please remember to water the plants on the balcony while I am away next week.")


def speech_audio(seconds: float) -> tuple[np.ndarray, str]:
    """[n] float32 at 24 kHz: eSpeak NG speaking SPEECH, repeated to `seconds`."""
    audio = speak(SPEECH, rate_hz=MODEL_RATE_HZ)
    source = f"eSpeak NG {espeak().version()} ({len(audio) / MODEL_RATE_HZ:.1f} s, repeated)"
    repeats = int(np.ceil(seconds * MODEL_RATE_HZ / audio.size))
    return np.tile(audio, repeats)[:int(seconds * MODEL_RATE_HZ)].astype(np.float32), source


def _rate(fmt: str) -> int:
    return FORMATS[fmt].default_rate_hz or MODEL_RATE_HZ


def cost_per_audio_s(fmt: str, audio: np.ndarray, chunk_samples: int, repeats: int,
                     workers: AudioWorkers) -> dict:
    """The pipeline in this thread: CPU s and wall s per audio second (best of `repeats`)."""
    best_cpu, best_wall, out_bytes = float("inf"), float("inf"), 0
    for _ in range(repeats):
        out = AudioOut(fmt, MODEL_RATE_HZ, _rate(fmt), 1.0, workers)
        cpu0, wall0, size = time.thread_time(), time.perf_counter(), 0
        for i in range(0, audio.size, chunk_samples):
            size += len(out.convert(audio[i:i + chunk_samples], False))
        size += len(out.convert(audio[:0], True))
        best_cpu = min(best_cpu, time.thread_time() - cpu0)
        best_wall = min(best_wall, time.perf_counter() - wall0)
        out_bytes = size
    seconds = audio.size / MODEL_RATE_HZ
    return {"cpu_s_per_audio_s": best_cpu / seconds, "wall_s_per_audio_s": best_wall / seconds,
            "kbit_per_s": 8 * out_bytes / seconds / 1000}


def process_cpu_s() -> float:
    """This process's user + system CPU seconds, from /proc/self/stat (ticks)."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def serve_streams(fmt: str, audio: np.ndarray, streams: int, threads: int) -> dict:
    """`streams` responses at once on this loop, 1 s chunks, codecs on a pool of `threads`."""
    workers = AudioWorkers(threads, "higgs-encode")
    lag = [0.0]
    stop = asyncio.Event()

    async def ticker() -> None:  # how late the loop wakes a 5 ms sleeper
        while not stop.is_set():
            t = time.perf_counter()
            await asyncio.sleep(0.005)
            lag[0] = max(lag[0], time.perf_counter() - t - 0.005)

    async def respond() -> int:
        out, size = AudioOut(fmt, MODEL_RATE_HZ, _rate(fmt), 1.0, workers), 0
        for i in range(0, audio.size, MODEL_RATE_HZ):
            size += len(await out.push(audio[i:i + MODEL_RATE_HZ]))
        return size + len(await out.close())

    tick = asyncio.create_task(ticker())
    cpu0, wall0 = process_cpu_s(), time.perf_counter()
    await asyncio.gather(*(respond() for _ in range(streams)))
    wall, cpu = time.perf_counter() - wall0, process_cpu_s() - cpu0
    stop.set()
    await tick
    workers.shutdown()
    audio_s = streams * audio.size / MODEL_RATE_HZ
    return {"threads": threads, "streams": streams, "audio_s": audio_s, "wall_s": wall,
            "audio_s_per_s": audio_s / wall, "process_cores_busy": cpu / wall,
            "cpu_s_per_audio_s": cpu / audio_s, "loop_lag_ms_max": 1e3 * lag[0]}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS))
    p.add_argument("--seconds", type=float, default=60.0, help="audio per cost measurement")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--streams", type=int, default=8, help="concurrent responses in (2)")
    p.add_argument("--stream-seconds", type=float, default=20.0, help="audio per response in (2)")
    p.add_argument("--serving-formats", nargs="+", default=["mp3", "opus", "aac", "flac"],
                   choices=list(FORMATS))
    p.add_argument("--target-audio-s-per-s", type=float, default=1200.0)
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = now_iso()
    audio, source = speech_audio(args.seconds)
    cores = os.cpu_count() or 1
    result = {**provenance("bench_encoders", started), "audio": source,
              "host_cores": cores, "load_avg_before": os.getloadavg(),
              "settings": vars(args), "cost": [], "serving": [], "cores_for_target": {}}
    pool = AudioWorkers(1, "higgs-encode")  # unused by convert(); AudioOut wants one
    for fmt in args.formats:
        steady = cost_per_audio_s(fmt, audio, MODEL_RATE_HZ, args.repeats, pool)
        first = cost_per_audio_s(fmt, audio, MODEL_RATE_HZ // 25, args.repeats, pool)
        row = {"format": fmt, "rate_hz": _rate(fmt), **steady,
               "cpu_s_per_audio_s_40ms_chunks": first["cpu_s_per_audio_s"]}
        result["cost"].append(row)
        print(f"{fmt}: {1e3 * row['cpu_s_per_audio_s']:.2f} ms CPU per audio s "
              f"(40 ms chunks {1e3 * row['cpu_s_per_audio_s_40ms_chunks']:.2f}), "
              f"{row['kbit_per_s']:.0f} kbit/s", flush=True)
    pool.shutdown()
    stream_audio = audio[:int(args.stream_seconds * MODEL_RATE_HZ)]
    for fmt in args.serving_formats:
        for threads in sorted({1, cores}):
            row = {"format": fmt, **asyncio.run(serve_streams(fmt, stream_audio, args.streams,
                                                              threads))}
            result["serving"].append(row)
            print(f"{fmt} x{args.streams} streams, {threads} thread(s): "
                  f"{row['audio_s_per_s']:.0f} audio s/s, {row['process_cores_busy']:.2f} cores, "
                  f"loop lag max {row['loop_lag_ms_max']:.1f} ms", flush=True)
    for fmt in args.serving_formats:
        rows = {r["threads"]: r for r in result["serving"] if r["format"] == fmt}
        one, many = rows[1], rows[max(rows)]
        efficiency = (many["audio_s_per_s"] / one["audio_s_per_s"]) / max(rows)
        cost = next(r["cpu_s_per_audio_s"] for r in result["cost"] if r["format"] == fmt) \
            if fmt in args.formats else many["cpu_s_per_audio_s"]
        result["cores_for_target"][fmt] = {
            "cpu_s_per_audio_s": cost, "thread_scaling_efficiency": efficiency,
            "cores": args.target_audio_s_per_s * cost / min(1.0, efficiency),
            "cores_at_perfect_scaling": args.target_audio_s_per_s * cost}
    result["load_avg_after"] = os.getloadavg()
    result["finished_at"] = now_iso()
    print("\n" + markdown_table(result["cost"], [
        ("format", "format"), ("rate_hz", "Hz"), ("cpu_s_per_audio_s", "CPU s per audio s"),
        ("cpu_s_per_audio_s_40ms_chunks", "same, 40 ms chunks"), ("kbit_per_s", "kbit/s")]))
    print("\n" + markdown_table(result["serving"], [
        ("format", "format"), ("threads", "threads"), ("audio_s_per_s", "audio s/s"),
        ("process_cores_busy", "cores busy"), ("loop_lag_ms_max", "loop lag max ms")]))
    for fmt, row in result["cores_for_target"].items():
        print(f"{fmt}: {row['cores']:.1f} cores for {args.target_audio_s_per_s:.0f} audio s/s "
              f"(scaling efficiency {row['thread_scaling_efficiency']:.2f})")
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
