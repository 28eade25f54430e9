"""Memory of watermark detection under hostile files and concurrency (issue 52): the server's
RSS per detection in flight.

The real server (a subprocess, the tiny model on CPU, the mark off: the detector is the only
PerTh it loads) is warmed with one detection (the detector's model loads then), and its RSS
(VmRSS) is sampled every 0.1 s while `--concurrency` clients each post one hostile file at once
to POST /v1/audio/watermark/detect. Reported per file and concurrency: RSS before, the peak,
(peak - before) / detections admitted (those answered 200; the rest got 429, bounded by
server/limits/detect_slots.py), the statuses, and the wall time.

Files (made here, small on the wire, long when decoded):
- `flac_silence_192k`: 299 s of silence at 192 kHz, FLAC (about 180 KB): the issue's file;
- `wav_noise_8k`: 299 s of noise at 8 kHz, 16-bit WAV (4.8 MB);
- `flac_unknown_length_192k`: the same silence in a FLAC whose header leaves the length open.

    PYTHONPATH=src python benchmarks/limits/bench_detect_memory.py --out benchmarks/results/detect_memory_cpu.json
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
from serving.bench_serving import free_port, stop_server, wait_ready  # noqa: E402
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model directory (default: a fresh tiny model)")
    p.add_argument("--files", nargs="+", default=list(FILES), choices=list(FILES))
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 16])
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    started = now_iso()
    work = Path(tempfile.mkdtemp(prefix="detect_memory_"))
    model = Path(args.model) if args.model else make_tiny_model(work)
    port = free_port()
    command = [sys.executable, "-m", "higgs_serve.cli", "--log-level", "WARNING", "serve", str(model),
               "--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--watermark", "off",
               "--voices-dir", str(work / "voices")]
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
    finally:
        stop_server(proc)
    result["finished_at"] = now_iso()
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
