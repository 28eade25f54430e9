"""Encoder processes' memory over streams abandoned mid-way (issue 52): each worker's RSS must
stay flat (<= 20 MB growth per worker over 1,000 abandoned streams).

The server's last mile exactly as a response runs it (server/last_mile/audio_out.py over an
EncodePool): `--streams` responses, one after another, each in the next of `--formats`, push
1 to 5 chunks of `--chunk-s` seconds of speech-like audio and are then abandoned: released (what
every surface's `finally` does when a client leaves) or, one in `--unreleased-every`, dropped
without a release (the collector's finalizer path). Every `--sample-every` streams, each
encoder process's VmRSS is read (/proc/PID/status) after a round trip through it (a finished
stream, so every drop before it has been handled). Reported: each process's RSS after the
start-up, after the first sample (warm: every codec opened), at the end, and the growth from
the warm sample to the end.

    PYTHONPATH=src python benchmarks/limits/bench_abandoned_streams.py --out benchmarks/results/abandoned_streams_cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from common import markdown_table, now_iso, provenance, write_json  # noqa: E402

from higgs_serve.server.last_mile.audio_out import AudioOut  # noqa: E402
from higgs_serve.server.last_mile.encode_pool import EncodePool  # noqa: E402

RATE_HZ = 24000
LIMIT_MB = 20.0  # issue 52's acceptance, per worker


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def speech_like(seconds: float, seed: int) -> np.ndarray:
    """A voiced buzz with a wandering pitch and noise: every codec has real work to do."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE_HZ)) / RATE_HZ
    pitch = 120 + 40 * np.sin(2 * np.pi * 0.7 * t)
    voice = np.sign(np.sin(2 * np.pi * np.cumsum(pitch) / RATE_HZ)) * 0.2
    return (voice + 0.02 * rng.standard_normal(t.size)).astype(np.float32)


async def settle(pool: EncodePool) -> None:
    """One whole stream per process: its reply comes after every drop sent before it."""
    for _ in range(pool.size):
        out = AudioOut("flac", RATE_HZ, RATE_HZ, 1.0, pool)
        try:
            await out.close(speech_like(0.04, 0))
        finally:
            out.release()


async def run(args: argparse.Namespace) -> dict:
    pool = EncodePool(args.processes)
    await pool.start()
    try:
        pids = pool.pids()
        started = {pid: rss_mb(pid) for pid in pids}
        audio = speech_like(args.chunk_s * 5, 1)
        chunk = int(args.chunk_s * RATE_HZ)
        samples, t0 = [], time.perf_counter()
        for i in range(args.streams):
            out = AudioOut(args.formats[i % len(args.formats)], RATE_HZ, RATE_HZ, 1.0, pool)
            for k in range(1 + i % 5):
                await out.push(audio[k * chunk:(k + 1) * chunk])
            if args.unreleased_every and i % args.unreleased_every == args.unreleased_every - 1:
                del out  # never released: the collector's finalizer drops it
                gc.collect()
            else:
                out.release()
            if (i + 1) % args.sample_every == 0:
                await settle(pool)
                samples.append({"streams": i + 1, "rss_mb": {str(pid): rss_mb(pid) for pid in pids}})
        wall_s = time.perf_counter() - t0
        assert pool.pids() == pids, "an encoder process was replaced during the run"
    finally:
        await pool.shutdown()
    warm, end = samples[0]["rss_mb"], samples[-1]["rss_mb"]
    workers = [{"pid": pid, "rss_started_mb": round(started[pid], 1), "rss_warm_mb": round(warm[str(pid)], 1),
                "rss_end_mb": round(end[str(pid)], 1), "growth_mb": round(end[str(pid)] - warm[str(pid)], 1),
                "growth_from_start_mb": round(end[str(pid)] - started[pid], 1)} for pid in pids]
    return {"workers": workers, "samples": samples, "wall_s": round(wall_s, 1),
            "max_growth_mb": max(w["growth_mb"] for w in workers),
            "within_limit": all(w["growth_mb"] <= LIMIT_MB for w in workers)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--formats", type=lambda s: s.split(","), default=["mp3", "aac", "flac", "opus"])
    parser.add_argument("--chunk-s", type=float, default=0.2)
    parser.add_argument("--unreleased-every", type=int, default=10, help="0: release every stream")
    parser.add_argument("--sample-every", type=int, default=100)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    started_at = now_iso()
    result = asyncio.run(run(args))
    print(markdown_table(result["workers"], [("pid", "pid"), ("rss_started_mb", "RSS started MB"),
                                             ("rss_warm_mb", f"RSS after {args.sample_every} MB"),
                                             ("rss_end_mb", f"RSS after {args.streams} MB"),
                                             ("growth_mb", "growth MB")]))
    print(f"max growth {result['max_growth_mb']} MB per worker (limit {LIMIT_MB}): "
          f"{'within' if result['within_limit'] else 'OVER'}")
    if args.out:
        write_json(args.out, {**provenance("bench_abandoned_streams", started_at),
                              "settings": vars(args), "limit_mb": LIMIT_MB, **result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
