"""What the encoder processes buy (docs/architecture.md#encoder-processes): how much encoding
mp3/opus/aac responses slows a busy thread of the server process, with the codecs on the encode
threads (--encode-processes 0) and in encoder processes (the default), side by side in one run.

The probe stands in for the engine loop: a thread of this (server-like) process doing steady
Python + NumPy work in short iterations (~0.1 ms alone) (the scheduler's bookkeeping, small array ops), timing each
one. While it runs, K responses (4, 16, 64) are encoded at once on this process's asyncio loop,
each pushing 200 ms chunks of real speech (eSpeak NG, repeated) through its own `AudioOut` as fast
as the encoder takes them, exactly as the server does (server/last_mile/audio_out.py):
- `threads`: AudioWorkers with the server's default encode threads; the codecs run here, under
  this process's GIL between PyAV's GIL-free stretches;
- `processes`: an EncodePool with the server's default process count (host cores less 2, at
  least 1); this process only moves float32 and bytes over the sockets.

For each (format, K, mode): the probe's iterations/s and p50/p99 iteration latency as ratios to the
probe alone (measured in the same run, before and after), encoding throughput (audio-s per wall
s), and CPU per audio-second: this process's CPU (resource) less the probe thread's own
(CLOCK_THREAD_CPUTIME_ID), plus the encoder processes' (/proc/PID/stat). os.getloadavg() is
recorded before and after: on a shared 2-core host the absolute figures are noisy, the ratios
within one run are what count.

    PYTHONPATH=src python benchmarks/last_mile/bench_encode_gil.py --out benchmarks/results/encode_gil_cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from last_mile.bench_encoders import speech_audio  # noqa: E402
from common import markdown_table, now_iso, percentile, provenance, write_json  # noqa: E402

from higgs_serve.server.last_mile.audio_out import AudioOut  # noqa: E402
from higgs_serve.server.last_mile.audio_workers import AudioWorkers  # noqa: E402
from higgs_serve.server.last_mile.encode_pool import EncodePool  # noqa: E402
from higgs_serve.server.settings import DEFAULT_ENCODE_PROCESSES, DEFAULT_ENCODE_THREADS  # noqa: E402

MODEL_RATE_HZ = 24000
CHUNK_S = 0.2
_CLK_TCK = os.sysconf("SC_CLK_TCK")


class Probe:
    """A thread doing a short stretch of Python + NumPy work per iteration, timing each iteration."""

    def __init__(self):
        self._stop = threading.Event()
        self._marks: list[tuple[float, float]] = []  # (start, end) perf_counter of each iteration
        self._thread = threading.Thread(target=self._run, name="probe", daemon=True)
        self.cpu_s = 0.0  # the probe thread's own CPU, updated at each window's end
        self._state = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        table: dict[int, int] = {}
        while not self._stop.is_set():
            started = time.perf_counter()
            for i in range(400):  # bookkeeping in Python, as a scheduler step does
                table[i & 63] = table.get(i & 63, 0) + i
            for _ in range(8):  # and small array work
                self._state = np.tanh(self._state @ self._state.T * 1e-2)
            self._marks.append((started, time.perf_counter()))
            self.cpu_s = time.clock_gettime(time.CLOCK_THREAD_CPUTIME_ID)

    def window(self, start: float, end: float) -> dict:
        lat = [(b - a) * 1e3 for a, b in self._marks if a >= start and b <= end]
        return {"iterations_per_s": len(lat) / (end - start), "p50_ms": percentile(lat, 50),
                "p99_ms": percentile(lat, 99), "iterations": len(lat)}


def children_cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime
    return total


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def encode_responses(fmt: str, streams: int, seconds: float, audio: np.ndarray,
                           encoders: AudioWorkers | EncodePool) -> float:
    """`streams` responses of `seconds` each, concurrently; returns the audio-seconds encoded."""
    chunk = int(CHUNK_S * MODEL_RATE_HZ)
    count = int(seconds / CHUNK_S)

    async def one(index: int) -> int:
        out = AudioOut(fmt, MODEL_RATE_HZ, MODEL_RATE_HZ, 1.0, encoders)
        offset = (index * 7919) % (audio.size - chunk * count)  # each its own stretch of speech
        nbytes = 0
        try:
            for k in range(count - 1):
                nbytes += len(await out.push(audio[offset + k * chunk:offset + (k + 1) * chunk]))
            nbytes += len(await out.close(audio[offset + (count - 1) * chunk:offset + count * chunk]))
        finally:
            out.release()
        assert nbytes > 0
        return nbytes

    await asyncio.gather(*(one(i) for i in range(streams)))
    return streams * count * CHUNK_S


async def measure(probe: Probe, fmt: str, streams: int, seconds: float, audio: np.ndarray,
                  mode: str, encoders, pids: list[int]) -> dict:
    cpu0, kids0, probe0 = own_cpu_s(), children_cpu_s(pids), probe.cpu_s
    start = time.perf_counter()
    audio_s = await encode_responses(fmt, streams, seconds, audio, encoders)
    end = time.perf_counter()
    await asyncio.sleep(0.01)  # the probe's last iteration ends, its CPU clock is read
    server_cpu = (own_cpu_s() - cpu0) - (probe.cpu_s - probe0)
    children = children_cpu_s(pids) - kids0
    return {"format": fmt, "streams": streams, "mode": mode, "wall_s": end - start,
            "audio_s": audio_s, "audio_s_per_s": audio_s / (end - start),
            "server_cpu_ms_per_audio_s": 1e3 * server_cpu / audio_s,
            "encoder_processes_cpu_ms_per_audio_s": 1e3 * children / audio_s,
            "cpu_ms_per_audio_s": 1e3 * (server_cpu + children) / audio_s,
            "probe": probe.window(start, end)}


async def main_async(args) -> dict:
    audio, source = speech_audio(30.0)
    probe = Probe()
    threads = AudioWorkers(args.threads, "bench-encode")
    pool = EncodePool(args.processes)
    await pool.start()
    probe.start()
    rows = []
    try:
        async def idle(label: str) -> dict:
            start = time.perf_counter()
            await asyncio.sleep(args.idle_s)
            return {"when": label, **probe.window(start, time.perf_counter())}

        baselines = [await idle("before")]
        for fmt in args.formats:
            for streams in args.streams:
                for mode, encoders, pids in (("threads", threads, []),
                                             ("processes", pool, pool.pids())):
                    rows.append(await measure(probe, fmt, streams, args.seconds, audio, mode,
                                              encoders, pids))
                    print(rows[-1]["format"], streams, mode, f"{rows[-1]['audio_s_per_s']:.1f} audio-s/s",
                          f"probe {rows[-1]['probe']['iterations_per_s']:.0f} it/s", flush=True)
        baselines.append(await idle("after"))
    finally:
        probe.stop()
        await pool.shutdown()
        threads.shutdown()
    base_rate = np.mean([b["iterations_per_s"] for b in baselines])
    base_p50 = np.mean([b["p50_ms"] for b in baselines])
    base_p99 = np.mean([b["p99_ms"] for b in baselines])
    for row in rows:
        row["probe_slowdown"] = base_rate / row["probe"]["iterations_per_s"]
        row["probe_p50_ratio"] = row["probe"]["p50_ms"] / base_p50
        row["probe_p99_ratio"] = row["probe"]["p99_ms"] / base_p99
    return {"audio_source": source, "probe_alone": baselines, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--formats", nargs="+", default=["mp3", "opus", "aac"])
    parser.add_argument("--streams", nargs="+", type=int, default=[4, 16, 64])
    parser.add_argument("--seconds", type=float, default=1.0, help="audio per response")
    parser.add_argument("--threads", type=int, default=DEFAULT_ENCODE_THREADS)
    parser.add_argument("--processes", type=int, default=DEFAULT_ENCODE_PROCESSES)
    parser.add_argument("--idle-s", type=float, default=2.0, help="the probe alone, before and after")
    parser.add_argument("--out", default="benchmarks/results/encode_gil_cpu.json")
    args = parser.parse_args(argv)
    started = now_iso()
    load_before = os.getloadavg()
    result = asyncio.run(main_async(args))
    payload = {**provenance("bench_encode_gil", started), "cpu_count": os.cpu_count(),
               "encode_threads": args.threads, "encode_processes": args.processes,
               "seconds_per_response": args.seconds, "chunk_s": CHUNK_S,
               "loadavg_before": load_before, "loadavg_after": os.getloadavg(), **result}
    write_json(args.out, payload)
    print(markdown_table(result["rows"], [
        ("format", "format"), ("streams", "K"), ("mode", "mode"),
        ("audio_s_per_s", "audio-s/s"), ("cpu_ms_per_audio_s", "CPU ms/audio-s"),
        ("server_cpu_ms_per_audio_s", "server CPU ms/audio-s"),
        ("probe_slowdown", "probe slowdown"), ("probe_p50_ratio", "probe p50 x"),
        ("probe_p99_ratio", "probe p99 x")]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
