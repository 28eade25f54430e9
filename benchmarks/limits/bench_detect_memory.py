"""Memory of watermark detection under hostile files and concurrency (issue 52): the server's
RSS per detection in flight; and a batch of small detections (issue 61): `--batch-requests`
detections of a 1 s WAV sent `--batch-concurrency` at a time, each one's status and time.

The real server (a subprocess, the tiny model on CPU, the mark off: the detector is the only
PerTh it loads) is warmed with one detection (the detector's model loads then), and its RSS
(VmRSS) is sampled every 0.1 s while `--concurrency` clients each post one hostile file at once
to POST /v1/audio/watermark/detect. Reported per file and concurrency: RSS before, the peak,
(peak - before) / detections admitted (those answered 200; the rest got 429, bounded by
server/limits/detect_slots.py), the statuses, and the wall time. The batch reports the statuses,
each request's time from send to answer (median, 95th percentile, max; a detection that waits
for a slot waits at most --detect-wait-s, 5 s by default), the Retry-After of any 429, and the
RSS before and at its peak.

Files (made here, small on the wire, long when decoded):
- `flac_silence_192k`: 299 s of silence at 192 kHz, FLAC (about 180 KB): the issue's file;
- `wav_noise_8k`: 299 s of noise at 8 kHz, 16-bit WAV (4.8 MB);
- `flac_unknown_length_192k`: the same silence in a FLAC whose header leaves the length open.

    PYTHONPATH=src python benchmarks/limits/bench_detect_memory.py --out benchmarks/results/detect_memory_cpu.json
    PYTHONPATH=src python benchmarks/limits/bench_detect_memory.py --files --batch-requests 1000 \
        --batch-concurrency 64 --out benchmarks/results/detect_batch_cpu.json
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import soundfile as sf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from last_mile.bench_formats import make_tiny_model  # noqa: E402
from limits.bench_file_memory import RssSampler, rss_mb  # noqa: E402
from serving.server_process import free_port, stop_server, wait_ready  # noqa: E402
from common import now_iso, provenance, write_json  # noqa: E402

DETECT = "/v1/audio/watermark/detect"


def _flac(seconds: float, rate: int, unknown_length: bool = False) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, np.zeros(int(seconds * rate), np.int16), rate, format="FLAC", subtype="PCM_16")
    data = bytearray(buffer.getvalue())
    if unknown_length:  # STREAMINFO's 36-bit total samples (bytes 18+4 .. 18+8 of the file) zeroed
        data[21] &= 0xF0
        data[22:26] = b"\0\0\0\0"
    return bytes(data)


def _wav_noise(seconds: float, rate: int) -> bytes:
    buffer = io.BytesIO()
    noise = (np.random.default_rng(0).standard_normal(int(seconds * rate)) * 3000).astype(np.int16)
    sf.write(buffer, noise, rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


FILES = {
    "flac_silence_192k": lambda: _flac(299, 192_000),
    "wav_noise_8k": lambda: _wav_noise(299, 8000),
    "flac_unknown_length_192k": lambda: _flac(299, 192_000, unknown_length=True),
}


def run_case(url: str, pid: int, data: bytes, concurrency: int) -> dict:
    before = rss_mb(pid)
    started = time.perf_counter()
    with RssSampler(pid, 0.1) as sampler, ThreadPoolExecutor(concurrency) as pool:
        def post(_):
            return httpx.post(url + DETECT, files={"file": ("clip", data)}, timeout=900)
        answers = list(pool.map(post, range(concurrency)))
    statuses = [a.status_code for a in answers]
    admitted = statuses.count(200)
    peak = max(rss for _, rss in sampler.samples) if sampler.samples else before
    return {"concurrency": concurrency, "statuses": {str(s): statuses.count(s) for s in sorted(set(statuses))},
            "rss_before_mb": round(before, 1), "rss_peak_mb": round(peak, 1),
            "growth_mb": round(peak - before, 1),
            "growth_per_admitted_mb": round((peak - before) / max(admitted, 1), 1),
            "wall_s": round(time.perf_counter() - started, 1),
            "answers": sorted({a.text[:200] for a in answers})}


def run_batch(url: str, pid: int, requests: int, concurrency: int) -> dict:
    """`requests` small detections, `concurrency` clients each sending its next as soon as it is
    answered: every answer's status and time."""
    data = _wav_noise(1.0, 24_000)
    before = rss_mb(pid)
    started = time.perf_counter()
    with RssSampler(pid, 0.1) as sampler, ThreadPoolExecutor(concurrency) as pool, \
            httpx.Client(timeout=120, limits=httpx.Limits(max_connections=concurrency)) as client:
        def post(_):
            sent = time.perf_counter()
            answer = client.post(url + DETECT, files={"file": ("clip.wav", data)})
            return answer.status_code, time.perf_counter() - sent, answer.headers.get("retry-after")
        answers = list(pool.map(post, range(requests)))
    times = sorted(t for _, t, _ in answers)
    statuses = [status for status, _, _ in answers]
    peak = max(rss for _, rss in sampler.samples) if sampler.samples else before
    return {"requests": requests, "concurrency": concurrency, "file_bytes": len(data),
            "statuses": {str(s): statuses.count(s) for s in sorted(set(statuses))},
            "seconds_p50": round(times[len(times) // 2], 3),
            "seconds_p95": round(times[int(len(times) * 0.95)], 3), "seconds_max": round(times[-1], 3),
            "over_5_s": sum(t > 5.0 for t in times),
            "retry_after": sorted({r for s, _, r in answers if s == 429}),
            "rss_before_mb": round(before, 1), "rss_peak_mb": round(peak, 1),
            "growth_mb": round(peak - before, 1), "wall_s": round(time.perf_counter() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model directory (default: a fresh tiny model)")
    p.add_argument("--files", nargs="*", default=list(FILES), choices=list(FILES),
                   help="the hostile files (none: the batch only)")
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 16])
    p.add_argument("--batch-requests", type=int, default=0,
                   help="small detections in the batch (0: no batch)")
    p.add_argument("--batch-concurrency", type=int, default=64)
    p.add_argument("--server-arg", action="append", default=[],
                   help="one more `serve` argument (repeatable), e.g. --server-arg=--detect-wait-s=5")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    started = now_iso()
    work = Path(tempfile.mkdtemp(prefix="detect_memory_"))
    model = Path(args.model) if args.model else make_tiny_model(work)
    port = free_port()
    command = [sys.executable, "-m", "higgs_serve.cli", "--log-level", "WARNING", "serve", str(model),
               "--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--watermark", "off",
               "--voices-dir", str(work / "voices"), *args.server_arg]
    url = f"http://127.0.0.1:{port}"
    result = {**provenance("bench_detect_memory", started), "server_command": command, "cases": []}
    log_path = work / "server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        wait_ready(proc, url, 600, log_path)
        warm = httpx.post(url + DETECT, files={"file": ("clip", _wav_noise(2, 24_000))}, timeout=600)
        result["warm_up"] = {"status": warm.status_code, "rss_after_mb": round(rss_mb(proc.pid), 1)}
        for name in args.files:
            data = FILES[name]()
            for concurrency in args.concurrency:
                case = {"file": name, "file_bytes": len(data), **run_case(url, proc.pid, data, concurrency)}
                result["cases"].append(case)
                print({k: v for k, v in case.items() if k != "answers"}, flush=True)
        if args.batch_requests:
            result["batch"] = run_batch(url, proc.pid, args.batch_requests, args.batch_concurrency)
            print(result["batch"], flush=True)
    finally:
        stop_server(proc)
    result["finished_at"] = now_iso()
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
