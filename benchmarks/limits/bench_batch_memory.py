"""Memory and disk of one POST /v1/audio/speech/batch at the documented limits (issue 40 item 8):
the server's RSS and the temporary files it holds while the batch is made and answered.

The real server (a subprocess, the tiny model on CPU, the documented defaults: --max-input-chars
100,000, --max-audio-s 7,200) answers one batch per case; its resident memory (VmRSS) and the
bytes of the deleted temporary files it holds open (the items' spooled files,
server/last_mile/audio_file.py) are sampled every 0.5 s from before the request until --settle-s after the
answer was read. The client reads the answer in pieces and drops them, so only the server holds
anything; it checks the answer's length against its Content-Length.

    PYTHONPATH=src python benchmarks/limits/bench_batch_memory.py --out benchmarks/results/batch_memory_cpu.json

Cases (32 items, distinct seeds, 16-bit WAV at 48 kHz: the largest bytes per second):
- `admitted`: each item --admitted-chars characters, chosen so the 32 items' audio stays just
  under the 7,200 s the batch may hold (the tiny model: 220.44 s an item, 7,054 s in all): the
  largest batch answered 200, its ~677 MB of files sent as ~903 MB of JSON.
- `refused`: each item 3,125 characters (100,000 in all, the input limit): its audio passes
  7,200 s, so the batch is stopped there and answered 413 `batch_too_large`.
- `references`: 32 items of one sentence, each with its own inline 7 s WAV reference (a 14 MB
  body, under the 15 MB JSON limit): 32 clips decoded and encoded.
Each case runs --repeats times in a row, each run with its own seeds and clips: the first batch
of a kind after the server starts also pays its one-time growth (pages of the KV cache touched
for the first time, the reference encoder's first runs on the audio worker threads), the later
ones show what a batch itself holds and whether it is given back.
Without --model the tool writes the tiny checkpoint to a temporary directory first.
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import soundfile as sf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from limits.bench_file_memory import long_input, rss_mb  # noqa: E402
from last_mile.bench_formats import make_tiny_model  # noqa: E402
from serving.server_process import free_port, stop_server, wait_ready  # noqa: E402
from serving.stream_client import SENTENCES  # noqa: E402
from common import REPO_ROOT, markdown_table, now_iso, provenance, write_json  # noqa: E402

ITEMS = 32
# fields of an item's result and of the envelope, read from the answer as it passes
ITEM_FIELDS = re.compile(rb'"(output_tokens|finish_reason|status|succeeded|failed)":"?(\w+)')
FORMAT = {"response_format": "wav", "sample_rate": 48000}
CASES = ("admitted", "refused", "references")


def spooled_bytes(pid: int) -> int:
    """Bytes of the deleted temporary files the process holds open (its spilled answers)."""
    total = 0
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(fd_dir / fd)
            if target.startswith(tempfile.gettempdir()) and target.endswith("(deleted)"):
                total += os.stat(fd_dir / fd).st_size
        except OSError:  # closed while looked at
            continue
    return total


class Sampler:
    """(time s, RSS MB, spooled MB) every interval_s, from a thread of this (client) process."""

    def __init__(self, pid: int, interval_s: float = 0.5):
        self.pid, self.interval_s = pid, interval_s
        self.samples: list[tuple[float, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        t0 = time.perf_counter()
        while not self._stop.is_set():
            self.samples.append((time.perf_counter() - t0, rss_mb(self.pid),
                                 spooled_bytes(self.pid) / 1e6))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def reference_b64(seconds: float, seed: int) -> str:
    """A distinct 16-bit 24 kHz WAV clip of noise-shaped tones, base64."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(24000 * seconds)) / 24000
    audio = 0.2 * np.sin(2 * np.pi * rng.uniform(100, 300) * t) + 0.02 * rng.standard_normal(t.size)
    buffer = io.BytesIO()
    sf.write(buffer, audio.astype(np.float32), 24000, format="WAV", subtype="PCM_16")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def batch_body(case: str, admitted_chars: int, run: int) -> dict:
    """The case's batch; each run its own seeds (and its own reference clips)."""
    seeds = range(ITEMS * run, ITEMS * (run + 1))
    if case == "references":
        items = [{"input": SENTENCES[seed % len(SENTENCES)], "seed": seed,
                  "ref_audio": reference_b64(7.0, seed), "ref_text": SENTENCES[0]}
                 for seed in seeds]
        return {"items": items, **FORMAT}
    chars = admitted_chars if case == "admitted" else 100_000 // ITEMS
    text = long_input(chars)
    return {"items": [{"input": text, "seed": seed} for seed in seeds], **FORMAT}


def run_case(client: httpx.Client, pid: int, case: str, run: int, admitted_chars: int,
             settle_s: float) -> dict:
    body = batch_body(case, admitted_chars, run)
    before = rss_mb(pid)
    started = time.perf_counter()
    size, head, carry, frames, reasons = 0, b"", b"", [], Counter()
    with Sampler(pid) as sampler:
        with client.stream("POST", "/v1/audio/speech/batch", json=body) as response:
            status, headers = response.status_code, response.headers
            for piece in response.iter_raw():
                if len(head) < 4096:
                    head += piece[:4096]
                size += len(piece)
                # each item's fields follow its audio: read them from the pieces as they pass
                # (a short carry joins a field split between two pieces)
                text = carry + piece
                for match in ITEM_FIELDS.finditer(text):
                    if match.end() > len(carry):  # not already read from the last piece
                        field, value = match.group(1).decode(), match.group(2).decode()
                        if field == "output_tokens":
                            frames.append(int(value))
                        else:
                            reasons[f"{field} {value}"] += 1
                carry = text[-256:]
        done_s = time.perf_counter() - started
        time.sleep(settle_s)
    peak = max(rss for _, rss, _ in sampler.samples)
    row = {"case": case, "run": run + 1, "items": len(body["items"]),
           "input_chars": sum(len(item["input"]) for item in body["items"]), **FORMAT,
           "status": status, "answer_mb": size / 1e6, "fields": dict(reasons),
           "audio_s": sum(frames) / 25, "item_audio_s": sorted({f / 25 for f in frames}),
           "content_length_ok": status != 200 or int(headers["content-length"]) == size,
           "seconds": done_s, "rss_before_mb": before, "rss_peak_mb": peak,
           "rss_growth_mb": peak - before, "rss_after_mb": sampler.samples[-1][1],
           "rss_kept_mb": sampler.samples[-1][1] - before,
           "spooled_peak_mb": max(disk for _, _, disk in sampler.samples),
           "spooled_after_mb": sampler.samples[-1][2],
           "trace": [(round(t, 1), round(r, 1), round(d, 1)) for t, r, d in sampler.samples[::4]]}
    if status != 200:
        row["error"] = head.decode(errors="replace")[:400]
    return row


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model directory (default: a fresh tiny model)")
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    p.add_argument("--admitted-chars", type=int, default=720,
                   help="characters per item of the `admitted` case")
    p.add_argument("--repeats", type=int, default=2,
                   help="batches per case, one after another (the first after start pays the "
                   "server's one-time growth)")
    p.add_argument("--settle-s", type=float, default=3.0, help="sampled this long after")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = now_iso()
    work = Path(tempfile.mkdtemp(prefix="bench_batch_memory_"))
    model = Path(args.model) if args.model else make_tiny_model(work)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = work / "server.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (os.environ.get("PYTHONPATH"), str(REPO_ROOT / "src")) if p),
        "OMP_NUM_THREADS": "1"}  # one core for torch: the memory, not the speed, is measured
    command = [sys.executable, "-m", "higgs_serve.cli", "--log-level", "WARNING", "serve",
               str(model), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu",
               "--voices-dir", str(work / "voices")]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    result = {"load_avg_before": os.getloadavg(), "settings": vars(args),
              "server_command": command, "cases": []}
    try:
        wait_ready(proc, url, 300, log_path)
        with httpx.Client(base_url=url, timeout=None) as client:
            # warm-up: the encoder, a reference, long-form and the engine's shapes once
            client.post("/v1/audio/speech/batch", json={"items": [
                {"input": long_input(600)},
                {"input": SENTENCES[1], "ref_audio": reference_b64(7.0, 99),
                 "ref_text": SENTENCES[0]}], **FORMAT})
            for case, run in ((case, run) for case in args.cases for run in range(args.repeats)):
                row = run_case(client, proc.pid, case, run, args.admitted_chars, args.settle_s)
                result["cases"].append(row)
                print(f"{case} #{run + 1}: {row['status']}, {row['answer_mb']:.0f} MB answer in "
                      f"{row['seconds']:.0f} s; RSS {row['rss_before_mb']:.0f} -> peak "
                      f"{row['rss_peak_mb']:.0f} MB (+{row['rss_growth_mb']:.0f}), after "
                      f"{row['rss_after_mb']:.0f} MB; spooled peak {row['spooled_peak_mb']:.0f} "
                      f"MB, after {row['spooled_after_mb']:.0f} MB", flush=True)
                if args.out:
                    write_json(args.out, {**provenance("bench_batch_memory", started), **result})
    finally:
        result["server_exit_code"] = stop_server(proc)
        result["server_log_tail"] = log_path.read_text(errors="replace")[-2000:]
    result["load_avg_after"] = os.getloadavg()
    result = {**provenance("bench_batch_memory", started), **result}
    print("\n" + markdown_table(result["cases"], [
        ("case", "case"), ("run", "run"), ("status", "status"), ("answer_mb", "answer MB"), ("seconds", "s"),
        ("rss_before_mb", "RSS before MB"), ("rss_peak_mb", "peak MB"),
        ("rss_growth_mb", "growth MB"), ("rss_after_mb", "after MB"),
        ("spooled_peak_mb", "spooled peak MB")]))
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
