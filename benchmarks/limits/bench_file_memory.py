"""Memory of a whole-file (`stream: false`) response at the documented limits (issue 40 item 3):
the server's RSS while one long-form file is made, and after it.

The real server (a subprocess, the tiny model on CPU; `--max-audio-s` as given, the documented
7,200 s by default) answers one `stream: false` request of `--chars` characters (the documented
100,000 by default) in each `--cases` format; its resident memory (VmRSS in /proc/<pid>/status)
is sampled every 0.5 s from before the request until `--settle-s` after the body was read. The
client reads the body in pieces and drops them, so only the server holds anything. Reported per
case: RSS before, the peak, the growth (peak - before) in all and per 40 ms frame, the RSS after,
the audio seconds and the file's bytes (spilled to the server's temp directory past 1 MiB,
server/last_mile/audio_file.py), and whether a WAV's header states the length that came.

    PYTHONPATH=src python benchmarks/limits/bench_file_memory.py --out benchmarks/results/file_memory_cpu.json

Cases: `wav` (16-bit WAV at the model's 24 kHz: issue 61's request), `wav48k` (the largest file: 16-bit WAV at 48 kHz, 691 MB at 7,200 s), `mp3`, `speed`
(WAV at speed 1.25: the time stretch in the pipeline). Without --model the tool writes the tiny
checkpoint to a temporary directory first.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from last_mile.bench_formats import make_tiny_model  # noqa: E402
from serving.server_process import free_port, stop_server, wait_ready  # noqa: E402
from serving.stream_client import SENTENCES  # noqa: E402
from common import REPO_ROOT, markdown_table, now_iso, provenance, write_json  # noqa: E402

CASES = {
    "wav": {"response_format": "wav"},  # 24 kHz, the model's rate (issue 61's case)
    "wav48k": {"response_format": "wav", "sample_rate": 48000},
    "mp3": {"response_format": "mp3"},
    "speed": {"response_format": "wav", "speed": 1.25},
}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


class RssSampler:
    def __init__(self, pid: int, interval_s: float = 0.5):
        self.pid, self.interval_s = pid, interval_s
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        t0 = time.perf_counter()
        while not self._stop.is_set():
            self.samples.append((time.perf_counter() - t0, rss_mb(self.pid)))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def long_input(chars: int) -> str:
    text, i = "", 0
    while len(text) < chars:
        text += SENTENCES[i % len(SENTENCES)] + " "
        i += 1
    return text[:chars].rstrip()


WAV_HEADER_BYTES = 44  # RIFF, fmt and data chunk heads: the whole header our WAV files carry


def wav_header_check(head: bytes, size: int) -> dict:
    """A WAV file's header against its length: RIFF's size is the file less 8 bytes, data's the
    file less the header (audio/encoders/pcm.py patches both once the file is complete)."""
    if head[:4] != b"RIFF":
        return {}
    riff = int.from_bytes(head[4:8], "little")
    data = int.from_bytes(head[40:44], "little") if head[36:40] == b"data" else -1
    return {"wav_header_ok": riff == size - 8 and data == size - WAV_HEADER_BYTES}


def run_case(client: httpx.Client, pid: int, name: str, chars: int, settle_s: float) -> dict:
    body = {"input": long_input(chars), "stream": False, "seed": 1, **CASES[name]}
    before = rss_mb(pid)
    started = time.perf_counter()
    size, head = 0, b""
    with RssSampler(pid) as sampler:
        with client.stream("POST", "/v1/audio/speech", json=body) as response:
            response.raise_for_status()
            headers = response.headers
            for piece in response.iter_raw():
                head += piece[:WAV_HEADER_BYTES - len(head)]
                size += len(piece)
        done_s = time.perf_counter() - started
        time.sleep(settle_s)
    peak = max(rss for _, rss in sampler.samples)
    frames = int(headers["x-usage-output-tokens"])
    return {"case": name, **CASES[name], "chars": chars, "segments": int(headers["x-segment-count"]),
            "audio_s": frames / 25 / CASES[name].get("speed", 1.0), "frames": frames,
            "finish_reason": headers["x-finish-reason"], "file_mb": size / 1e6,
            "content_length_ok": int(headers["content-length"]) == size,
            **wav_header_check(head, size), "seconds": done_s, "rss_before_mb": before,
            "rss_peak_mb": peak, "rss_growth_mb": peak - before,
            "rss_growth_kb_per_frame": (peak - before) * 1024 / max(frames, 1), "rss_after_mb": sampler.samples[-1][1],
            "rss_kept_mb": sampler.samples[-1][1] - before,
            "rss_trace": [(round(t, 1), round(r, 1)) for t, r in sampler.samples[::4]]}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model directory (default: a fresh tiny model)")
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--chars", type=int, default=100_000, help="input length (the documented limit)")
    p.add_argument("--max-audio-s", type=float, default=7200.0,
                   help="the server's --max-audio-s (the documented limit)")
    p.add_argument("--settle-s", type=float, default=3.0, help="RSS sampled this long after")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = now_iso()
    work = Path(tempfile.mkdtemp(prefix="bench_file_memory_"))
    model = Path(args.model) if args.model else make_tiny_model(work)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = work / "server.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (os.environ.get("PYTHONPATH"), str(REPO_ROOT / "src")) if p),
        "OMP_NUM_THREADS": "1"}  # one core for torch: the memory, not the speed, is measured
    command = [sys.executable, "-m", "higgs_serve.cli", "--log-level", "WARNING", "serve",
               str(model), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu",
               "--voices-dir", str(work / "voices"), "--max-audio-s", str(args.max_audio_s),
               "--max-input-chars", str(max(args.chars, 100_000))]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    result = {"load_avg_before": os.getloadavg(), "settings": vars(args),
              "server_command": command, "cases": []}
    try:
        wait_ready(proc, url, 300, log_path)
        with httpx.Client(base_url=url, timeout=None) as client:
            for fmt in ("wav", "mp3"):  # warm-up: every encoder and the engine's shapes once
                client.post("/v1/audio/speech", json={"input": SENTENCES[0], "stream": False,
                                                      "response_format": fmt})
            for name in args.cases:
                row = run_case(client, proc.pid, name, args.chars, args.settle_s)
                result["cases"].append(row)
                print(f"{name}: {row['audio_s']:.0f} s of audio, {row['file_mb']:.0f} MB file in "
                      f"{row['seconds']:.0f} s; RSS {row['rss_before_mb']:.0f} -> peak "
                      f"{row['rss_peak_mb']:.0f} MB (+{row['rss_growth_mb']:.0f}), after "
                      f"{row['rss_after_mb']:.0f} MB", flush=True)
                if args.out:
                    write_json(args.out, {**provenance("bench_file_memory", started), **result})
    finally:
        result["server_exit_code"] = stop_server(proc)
    result["load_avg_after"] = os.getloadavg()
    result = {**provenance("bench_file_memory", started), **result}
    print("\n" + markdown_table(result["cases"], [
        ("case", "case"), ("audio_s", "audio s"), ("file_mb", "file MB"), ("seconds", "s"),
        ("rss_before_mb", "RSS before MB"), ("rss_peak_mb", "peak MB"),
        ("rss_growth_mb", "growth MB"), ("rss_growth_kb_per_frame", "KB/frame"),
        ("rss_after_mb", "after MB")]))
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
