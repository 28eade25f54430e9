"""Fuzz the surfaces of issue 40 against a real server on the tiny model (CPU), and measure what
each hostile input costs the server: status, /health latency, resident memory, log.

Three passes against one `higgs-serve serve` subprocess (tiny random checkpoint, CPU):
  1. hostile single requests, one at a time (REST bodies at and past every documented limit,
     reference codes, local FIFOs, batches at and past theirs, long-form, every response format
     streamed and as a `stream: false` file and the combinations a format refuses, WebSocket
     frames and clients that stop reading): each case's status, the worst /health latency while it ran, the server's RSS
     before, at its peak and 0.5 s after (did it come back?);
  2. schemathesis over every POST/DELETE operation of the server's own OpenAPI document
     (positive and negative cases): never a 5xx;
  3. a seeded WebSocket message fuzzer: random sessions of hostile frames (deep nesting, huge
     strings, wrong types, binary frames, lone surrogates, config fields of any type, messages
     interleaved with input.done/flush/close) ending in a random client behaviour (reads to the
     end, stops reading, closes abruptly, goes silent): no `internal_error`, and every session
     ends within send_timeout + idle_timeout (+ 1 s for the last frames) of the client's last act.
/health is polled every 20 ms and the server's RSS sampled from /proc by a separate process, so
the fuzzer's own work never delays the measurement. Tracebacks are counted in the server log.

    python benchmarks/limits/bench_fuzz_surfaces.py --out benchmarks/results/fuzz_surfaces_cpu.json
    python benchmarks/limits/bench_fuzz_surfaces.py --quick      # the short pass the test suite runs

Deterministic in what it sends (seeded); timings depend on the machine (loadavg is recorded).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import websockets

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from common import now_iso, provenance, write_json  # noqa: E402

IDLE_S = 2.0
SEND_TIMEOUT_S = 2.0
FRAMES = 8  # the profile's default frame cap: every generation stays short
LONG_FORM_CHARS = 100_000
FORMATS = ("wav", "pcm", "flac", "mp3", "opus", "aac", "ulaw", "alaw")
WS_END_SLACK_S = 1.0  # the last error and close frame (server/websocket/session.py FINAL_SEND_S)
SETTLE_S = 0.5

POLLER = r"""
import sys, time, httpx
url, pid, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def rss():
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0
with httpx.Client(timeout=30) as http, open(out, "w", buffering=1) as log:
    while True:
        start = time.monotonic()
        try:
            ok = http.get(url).status_code == 200
        except httpx.HTTPError:
            ok = False
        end = time.monotonic()
        try:
            memory = rss()
        except OSError:
            break
        log.write(f"{start:.4f} {end - start:.4f} {int(ok)} {memory}\n")
        time.sleep(max(0.0, 0.02 - (time.monotonic() - end)))
"""


QUICK_CASES = ("rest: 15 MB of empty arrays", "rest: 15 MB object of unique keys",
               "rest: reference_codes 750 rows (the limit)", "ws: 15 MB message of empty arrays")


# ----------------------------------------------------------------------------- the server
@dataclass
class Server:
    url: str
    process: subprocess.Popen
    log_path: Path
    media: Path
    poll_path: Path
    poller: subprocess.Popen | None = None

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://") + "/v1/audio/speech/stream"

    def stop(self) -> None:
        for proc in (self.poller, self.process):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()

    def samples(self) -> np.ndarray:
        """[n, 4]: start time, /health latency, ok, RSS bytes."""
        rows = [line.split() for line in self.poll_path.read_text().splitlines() if line.count(" ") == 3]
        return np.array(rows, dtype=np.float64).reshape(-1, 4)

    def tracebacks(self) -> int:
        text = self.log_path.read_text(errors="replace")
        return text.count("Traceback (most recent call last)") + len(
            re.findall(r"Exception in ASGI application", text))


def start_server(work: Path) -> Server:
    from higgs_serve.model.tiny import write_tiny_model

    model = work / "model"
    write_tiny_model(model, seed=0)
    media = work / "media"
    media.mkdir()
    (media / "clip.wav").write_bytes(_tone_wav(2.0))
    os.mkfifo(media / "pipe.wav")
    (media / "zero.wav").symlink_to("/dev/zero")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    overrides = json.dumps({"0": {"default_sampling_params": {"max_tokens": FRAMES}}})
    command = [sys.executable, "-m", "higgs_serve.cli", "--log-level", "INFO", "serve", str(model),
               "--device", "cpu", "--host", "127.0.0.1", "--port", str(port),
               "--voices-dir", str(work / "voices"), "--allowed-local-media-path", str(media),
               "--ws-idle-timeout-s", str(IDLE_S), "--send-timeout-s", str(SEND_TIMEOUT_S),
               "--max-num-seqs", "4", "--max-queue", "16", "--stage-overrides", overrides]
    log_path = work / "server.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    server = Server(f"http://127.0.0.1:{port}", process, log_path, media, work / "poll.txt")
    deadline = time.monotonic() + 180
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited:\n{log_path.read_text()}")
        try:
            if httpx.get(f"{server.url}/ready", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"the server was not ready in 180 s:\n{log_path.read_text()}")
        time.sleep(0.2)
    server.poller = subprocess.Popen([sys.executable, "-c", POLLER, f"{server.url}/health",
                                      str(process.pid), str(server.poll_path)])
    while not server.poll_path.exists() or not server.poll_path.read_text():
        time.sleep(0.05)
    return server


def _tone_wav(seconds: float, rate: int = 24000) -> bytes:
    import soundfile as sf

    t = np.arange(int(seconds * rate)) / rate
    buffer = io.BytesIO()
    sf.write(buffer, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate, format="WAV",
             subtype="PCM_16")
    return buffer.getvalue()


# ----------------------------------------------------------------------------- measuring a case
@dataclass
class Case:
    name: str
    outcome: str = ""  # statuses / event codes, as the client saw them
    server_errors: int = 0  # 5xx statuses or internal_error events
    seconds: float = 0.0
    worst_health_ms: float = 0.0
    health_failures: int = 0
    rss_before_mb: float = 0.0
    rss_peak_growth_mb: float = 0.0
    rss_after_growth_mb: float = 0.0
    extra: dict = field(default_factory=dict)


def measured(server: Server, name: str, run) -> Case:
    """Run `run()` (returns (outcome, server_errors, extra)) and read the poller's window."""
    time.sleep(0.1)
    start = time.monotonic()
    outcome, server_errors, extra = run()
    end = time.monotonic()
    time.sleep(SETTLE_S)
    rows = server.samples()
    before = rows[rows[:, 0] < start]
    during = rows[(rows[:, 0] + rows[:, 1] >= start) & (rows[:, 0] <= end)]
    after = rows[rows[:, 0] >= end + SETTLE_S - 0.1]
    base = before[-1, 3] if len(before) else rows[0, 3]
    window = rows[(rows[:, 0] >= start - 0.05) & (rows[:, 0] <= end + 0.05)]
    return Case(
        name=name, outcome=outcome, server_errors=server_errors, seconds=round(end - start, 3),
        worst_health_ms=round(1e3 * float(during[:, 1].max()), 1) if len(during) else 0.0,
        health_failures=int((during[:, 2] == 0).sum()) if len(during) else 0,
        rss_before_mb=round(base / 2**20, 1),
        rss_peak_growth_mb=round((window[:, 3].max() - base) / 2**20, 1) if len(window) else 0.0,
        rss_after_growth_mb=round(((after[-1, 3] if len(after) else rows[-1, 3]) - base) / 2**20, 1),
        extra=extra)


def _post(server: Server, path: str, body: bytes | dict, timeout: float = 120):
    def run():
        with httpx.Client(base_url=server.url, timeout=timeout) as http:
            if isinstance(body, dict):
                answer = http.post(path, json=body)
            else:
                answer = http.post(path, content=body, headers={"Content-Type": "application/json"})
        code = answer.headers.get("content-type", "").startswith("application/json") and \
            answer.status_code >= 400 and answer.json().get("error", {}).get("code")
        return f"{answer.status_code} {code or ''}".strip(), int(answer.status_code >= 500), \
            {"bytes": len(answer.content)}
    return run


# ----------------------------------------------------------------------------- pass 1: hostile
def rest_cases(server: Server, quick: bool) -> list[tuple[str, object]]:
    mib = 2**20
    n_15mb = 15_000_000
    codes_rows = [[1] * 8] * 820_000
    long_text = " ".join(f"Sentence {i} of a very long input is spoken here." for i in range(
        (LONG_FORM_CHARS if not quick else 3000) // 50))[: LONG_FORM_CHARS if not quick else 3000]
    cases = [
        ("rest: reference_codes 820,000 rows (14.7 MB)", _post(server, "/v1/audio/speech",
         json.dumps({"input": "hi", "reference_codes": codes_rows}).encode())),
        ("rest: 15 MB of empty arrays", _post(server, "/v1/audio/speech",
         b'{"input": "hi", "x": [' + b",".join([b"[]"] * (n_15mb // 3)) + b"]}")),
        ("rest: 15 MB object of unique keys", _post(server, "/v1/audio/speech",
         b'{"input": "hi", ' + b",".join(b'"k%d":0' % i for i in range(n_15mb // 12)) + b"}")),
        ("rest: 15 MB of integers", _post(server, "/v1/audio/speech",
         b'{"input": "hi", "x": [' + b",".join([b"1"] * (n_15mb // 2)) + b"]}")),
        ("rest: 15 MB of escaped quotes in input", _post(server, "/v1/audio/speech",
         json.dumps({"input": '"' * (n_15mb // 2)}).encode())),
        ("rest: nested 100,000 deep", _post(server, "/v1/audio/speech",
         b'{"input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")),
        ("rest: 10 MiB ref_audio of noise (base64)", _post(server, "/v1/audio/speech",
         {"input": "hi", "ref_audio": base64.b64encode(os.urandom(10 * mib)).decode()})),
        ("rest: reference_codes 750 rows (the limit)", _post(server, "/v1/audio/speech",
         {"input": "hi", "reference_codes": [[5] * 8] * 750, "response_format": "pcm"})),
        ("rest: 2 s reference clip", _post(server, "/v1/audio/speech",
         {"input": "hi", "ref_audio": base64.b64encode(_tone_wav(2.0)).decode(), "ref_text": "a"})),
        ("rest: sample_rate 0", _post(server, "/v1/audio/speech", {"input": "hi", "sample_rate": 0})),
        ("rest: /dev/zero through a symlink", _post(server, "/v1/audio/speech",
         {"input": "hi", "ref_audio": str(server.media / "zero.wav")})),
        ("rest: 8 requests naming a FIFO", _fifo_requests(server)),
        ("batch: client leaves mid-batch", _batch_disconnect(server)),
        (f"long-form: {len(long_text)} characters, SSE stream", _long_form_sse(server, long_text)),
    ]
    if not quick:
        item_text = long_text[:LONG_FORM_CHARS // 32]
        cases += [
            ("batch: 32 items, each with 750 rows of codes", _post(server, "/v1/audio/speech/batch",
             {"items": [{"input": f"Item {i}.", "reference_codes": [[i] * 8] * 750} for i in range(32)],
              "response_format": "pcm"}, timeout=300)),
            (f"long-form: {len(long_text)} characters, wav file (stream false: the whole-file path)",
             _post(server, "/v1/audio/speech", {"input": long_text, "response_format": "wav",
                                                "stream": False}, timeout=900)),
            (f"batch: 32 long-form items of every format, {32 * len(item_text)} characters in all "
             "(the limit)", _post(server, "/v1/audio/speech/batch", {"items": [
                 {"input": item_text, "seed": i, "response_format": FORMATS[i % len(FORMATS)]}
                 for i in range(32)]}, timeout=900)),
        ] + format_cases(server, long_text[:3000])
    cases.append(("batch: one character past the input limit, in all", _post(
        server, "/v1/audio/speech/batch", {"items": [
            {"input": "x" * (LONG_FORM_CHARS // 2)}, {"input": "y" * (LONG_FORM_CHARS // 2 + 1)}]})))
    return cases


def format_cases(server: Server, text: str) -> list[tuple[str, object]]:
    """Every format as the streaming rule answers no `stream` field (streamed; wav and flac a
    file) and as a file (`stream: false`), each a long-form request; then the combinations a
    format refuses."""
    speech = "/v1/audio/speech"
    cases = []
    for fmt in FORMATS:
        cases += [
            (f"format: {fmt}, no stream field, {len(text)} characters",
             _post(server, speech, {"input": text, "response_format": fmt}, timeout=300)),
            (f"format: {fmt}, stream false, {len(text)} characters",
             _post(server, speech, {"input": text, "response_format": fmt, "stream": False},
                   timeout=300)),
        ]
    return cases + [
        ("format: aac over SSE at 48 kHz", _post(server, speech, {
            "input": text, "response_format": "aac", "sample_rate": 48000,
            "stream_format": "sse"}, timeout=300)),
        ("format: mp3, stream false, speed 0.25", _post(server, speech, {
            "input": text, "response_format": "mp3", "stream": False, "speed": 0.25},
            timeout=300)),
        ("format: opus at 22050 Hz", _post(server, speech, {
            "input": "hi", "response_format": "opus", "sample_rate": 22050})),
        ("format: ulaw at 12345 Hz", _post(server, speech, {
            "input": "hi", "response_format": "ulaw", "sample_rate": 12345})),
        ("format: stream false with stream_format sse", _post(server, speech, {
            "input": "hi", "response_format": "flac", "stream": False, "stream_format": "sse"})),
        ("format: stream false with initial_codec_chunk_frames", _post(server, speech, {
            "input": "hi", "response_format": "alaw", "stream": False,
            "initial_codec_chunk_frames": 2})),
    ]


def _fifo_requests(server: Server):
    def run():
        body = {"input": "hi", "ref_audio": str(server.media / "pipe.wav")}
        with httpx.Client(base_url=server.url, timeout=30) as http:
            threads, statuses = [], []
            for _ in range(8):
                thread = threading.Thread(target=lambda: statuses.append(
                    http.post("/v1/audio/speech", json=body).status_code))
                thread.start()
                threads.append(thread)
            for thread in threads:
                thread.join()
        return " ".join(map(str, sorted(statuses))), sum(s >= 500 for s in statuses), {}
    return run


def _batch_disconnect(server: Server):
    def run():
        try:
            httpx.post(f"{server.url}/v1/audio/speech/batch", timeout=0.3, json={
                "items": [{"input": f"Item number {i} is a sentence."} for i in range(8)]})
            return "answered before the client left", 0, {}
        except httpx.ReadTimeout:
            time.sleep(0.5)
            in_flight = _metric(server, "higgs_serve_server_in_flight_requests")
            return f"client left; in flight after 0.5 s: {in_flight:g}", 0, {}
    return run


def _long_form_sse(server: Server, text: str):
    def run():
        events = Counter()
        with httpx.Client(base_url=server.url, timeout=900) as http:
            with http.stream("POST", "/v1/audio/speech", json={
                    "input": text, "response_format": "pcm", "stream_format": "sse"}) as answer:
                for line in answer.iter_lines():
                    if line.startswith("data: "):
                        events[json.loads(line[6:])["type"]] += 1
        return f"{answer.status_code} {dict(events)}", int(answer.status_code >= 500), \
            {"segments": events["speech.segment.done"]}
    return run


def _metric(server: Server, name: str) -> float:
    for line in httpx.get(f"{server.url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return float("nan")


def ws_cases(server: Server) -> list[tuple[str, object]]:
    config = {"type": "session.config", "response_format": "pcm"}
    clip = base64.b64encode(_tone_wav(3.0)).decode()
    return [
        ("ws: nested 99,999 deep", _ws(server, [json.dumps(config), "[" * 99_999])),
        ("ws: 15 MB message of empty arrays", _ws(server, [
            json.dumps(config), "[" + ",".join(["[]"] * 5_000_000) + "]"])),
        ("ws: session.config with a 3 s clip (192 KB)", _ws(server, [
            json.dumps({**config, "ref_audio": clip, "ref_text": "a"}),
            json.dumps({"type": "input.text", "text": "Cloned."})])),
        ("ws: session.config with a 10 MiB noise clip", _ws(server, [
            json.dumps({**config, "ref_audio": base64.b64encode(os.urandom(10 * 2**20)).decode()})])),
        ("ws: 90,000 characters, then 5,000 one-space messages, then gone", _ws(server, [
            json.dumps(config), json.dumps({"type": "input.text", "text": "a" * 90_000}),
            *[json.dumps({"type": "input.text", "text": " "})] * 5000], leave=True)),
        ("ws: 20 sentences, then the client stops reading", _ws_unread(server)),
    ]


def _ws(server: Server, messages: list[str | bytes], leave: bool = False):
    """Send the messages, then session.close and read to the end (leave: drop the connection
    once the server has answered what it was sent so far)."""
    def run():
        async def session():
            async with websockets.connect(server.ws_url, max_size=None) as ws:
                for message in messages:
                    await ws.send(message)
                if leave:
                    await asyncio.sleep(1.0)
                    ws.transport.abort()
                    return ["left"], None
                await ws.send(json.dumps({"type": "session.close"}))
                codes = []
                async for message in ws:
                    if isinstance(message, str):
                        event = json.loads(message)
                        codes.append(event.get("code") or event["type"])
                return codes, ws.close_code
        codes, close = asyncio.run(session())
        counted = Counter(c for c in codes if c not in ("audio.start", "audio.done"))
        return f"{dict(counted)} close {close}", counted["internal_error"], {}
    return run


def _ws_unread(server: Server):
    def run():
        async def session():
            ws = await websockets.connect(server.ws_url, max_size=None)
            await ws.send(json.dumps({"type": "session.config", "response_format": "pcm",
                                      "sample_rate": 48000}))
            text = " ".join(f"Sentence number {i} goes here." for i in range(20))
            await ws.send(json.dumps({"type": "input.text", "text": text + " And"}))
            ws.transport.pause_reading()
            quiet = time.monotonic()
            while _metric(server, "higgs_serve_ws_sessions") > 0:
                if time.monotonic() - quiet > 120:
                    break
                await asyncio.sleep(0.05)
            took = time.monotonic() - quiet
            ws.transport.abort()
            return took
        took = asyncio.run(session())
        return f"session ended {took:.2f} s after the client stopped reading", 0, {"end_s": round(took, 2)}
    return run


# ----------------------------------------------------------------------------- pass 2: REST fuzz
def schemathesis_pass(server: Server, examples: int) -> dict:
    import hypothesis
    import requests
    import schemathesis
    from schemathesis.checks import not_a_server_error

    openapi = httpx.get(f"{server.url}/openapi.json").json()
    fields = openapi["components"]["schemas"]["SpeechRequestBody"]["properties"]
    for name in ("max_new_tokens", "min_new_tokens"):  # keep generations short
        for option in fields[name]["anyOf"]:
            if option.get("type") == "integer":
                option["maximum"] = FRAMES
    schema = schemathesis.openapi.from_dict(openapi)
    counts = Counter()
    failures: list[str] = []
    with requests.Session() as session:
        for result in schema.get_all_operations():
            operation = result.ok()
            if operation.method.upper() not in ("POST", "DELETE"):
                continue
            modes = [schemathesis.GenerationMode.POSITIVE]
            if operation.method.upper() == "POST":
                modes.append(schemathesis.GenerationMode.NEGATIVE)
            for mode in modes:
                @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
                @hypothesis.settings(max_examples=examples, deadline=None, derandomize=True,
                                     database=None, suppress_health_check=list(hypothesis.HealthCheck))
                def run(case) -> None:
                    response = case.call(base_url=server.url, session=session, timeout=60)
                    counts["cases"] += 1
                    counts[f"{response.status_code // 100}xx"] += 1
                    try:
                        case.validate_response(response, checks=[not_a_server_error])
                    except Exception as error:  # noqa: BLE001: every failure is reported
                        failures.append(f"{operation.method} {operation.path}: {str(error)[:200]}")

                run()
    return {"cases": counts["cases"], "by_class": {k: v for k, v in counts.items() if k != "cases"},
            "5xx": counts["5xx"], "failures": failures[:20]}


# ----------------------------------------------------------------------------- pass 3: WS fuzz
def fuzz_frame(rng: random.Random, configured: bool) -> str | bytes:
    """One hostile (or ordinary) client frame."""
    kind = rng.choice(["config", "text", "text", "done", "flush", "json", "deep", "huge",
                       "binary", "unknown", "surrogate", "config_fields", "whitespace"])
    if kind == "config" or (kind == "text" and not configured and rng.random() < 0.5):
        config = {"type": "session.config", "response_format": rng.choice(FORMATS),
                  "max_new_tokens": rng.randint(1, FRAMES)}
        if rng.random() < 0.3:
            config = {"type": "session.config", "session": {k: v for k, v in config.items() if k != "type"}}
        return json.dumps(config)
    if kind == "text":
        words = rng.choice(["Hello there.", "Dr. Smith paid 3.14", " and then", "你好。", "<|emotion:happy|>",
                            '"quoted', "Wait... what?", "\n", ""])
        return json.dumps({"type": "input.text", "text": words})
    if kind == "done":
        return json.dumps({"type": rng.choice(["input.done", "input.done", "session.close"])})
    if kind == "flush":
        return json.dumps({"type": "input.flush"})
    if kind == "json":
        return rng.choice(["{not json", "[1, 2]", '"just a string"', "null", "{}", '{"type": 5}',
                           '{"type": null}', "1e99999", "{" * 3 + "}" * 3])
    if kind == "deep":
        depth = rng.choice([17, 1000, 99_999])
        return "[" * depth + "]" * rng.choice([0, depth])
    if kind == "huge":
        return json.dumps({"type": "input.text", "text": "x" * rng.choice([10_000, 200_000, 2_000_000])})
    if kind == "binary":
        return bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 1, 100])))
    if kind == "unknown":
        return json.dumps({"type": rng.choice(["input.commit", "session.update", "", "x" * 1000])})
    if kind == "surrogate":
        return '{"type": "input.text", "text": "a\\ud800b"}'
    if kind == "whitespace":
        return json.dumps({"type": "input.text", "text": " " * rng.choice([1, 1000])})
    values = [None, True, -1, 0, 2**70, 1.5, "x", "", [], {}, [[1] * 8] * 3, "\\u0000", "a" * 5000]
    fields = ["voice", "speed", "seed", "temperature", "top_k", "sample_rate", "language",
              "ref_audio", "reference_codes", "stream_audio", "audio_transport", "protocol",
              "split_granularity", "input", "session", "initial_codec_chunk_frames", "bogus"]
    config = {"type": "session.config", **{rng.choice(fields): rng.choice(values)
                                           for _ in range(rng.randint(1, 3))}}
    return json.dumps(config)


async def fuzz_session(url: str, rng: random.Random, unread: list) -> dict:
    """A random session; returns its error codes, close code, and how long after the client's
    last act the server ended it. Endings: `close` (session.close, read to the end), `silent`
    (read, send nothing more: the idle timeout), `abort` (drop the connection), `stop_reading`
    (send nothing, read nothing: left in `unread`, ended by the server's timeouts)."""
    ending = rng.choice(["close", "close", "silent", "abort", "stop_reading"])
    frames = [fuzz_frame(rng, i > 0) for i in range(rng.randint(1, 12))]
    if ending == "close":
        frames.append(json.dumps({"type": "session.close"}))
    codes: list[str] = []
    ws = await websockets.connect(url, max_size=None)
    for frame in frames:
        try:
            await ws.send(frame)
        except websockets.ConnectionClosed:
            break
    last_act = time.monotonic()
    if ending == "abort":
        ws.transport.abort()
        return {"ending": ending, "codes": codes, "close": None, "end_s": None}
    if ending == "stop_reading":
        ws.transport.pause_reading()
        unread.append(ws)
        return {"ending": ending, "codes": codes, "close": None, "end_s": None}
    # the session may still be speaking what it was sent: the bound runs from the later of the
    # client's last act and the server's last message that was not the ending itself
    last_activity = last_act
    try:
        while True:
            message = await asyncio.wait_for(ws.recv(), timeout=SEND_TIMEOUT_S + IDLE_S + 30)
            event = json.loads(message) if isinstance(message, str) else {"type": "<audio>"}
            if event["type"] == "error":
                codes.append(event["code"])
            if event.get("code") not in ("idle_timeout", "send_timeout") and event["type"] != "session.done":
                last_activity = time.monotonic()
    except websockets.ConnectionClosed:
        pass
    except TimeoutError:
        codes.append("<no end within the bound>")
    end_s = time.monotonic() - max(last_act, last_activity)
    await ws.close()
    return {"ending": ending, "codes": codes, "close": ws.close_code, "end_s": end_s}


def ws_fuzz_pass(server: Server, sessions: int, seed: int) -> dict:
    rng = random.Random(seed)
    results, unread = [], []

    async def run_all() -> float:
        for _ in range(sessions):
            results.append(await fuzz_session(server.ws_url, random.Random(rng.getrandbits(64)),
                                              unread))
        # the clients that stopped reading: their sessions end on the server's side alone
        quiet = time.monotonic()
        while _metric(server, "higgs_serve_ws_sessions") > 0:
            if time.monotonic() - quiet > 120:
                break
            await asyncio.sleep(0.1)
        waited = time.monotonic() - quiet
        for ws in unread:
            ws.transport.abort()
        return waited

    start = time.monotonic()
    unread_end_s = asyncio.run(run_all())
    codes = Counter(code for r in results for code in r["codes"])
    quiet = [r["end_s"] for r in results if r["ending"] in ("close", "silent") and r["end_s"] is not None]
    return {"sessions": sessions, "frames_seed": seed, "seconds": round(time.monotonic() - start, 1),
            "error_codes": dict(codes.most_common()), "internal_errors": codes["internal_error"],
            "close_codes": dict(Counter(str(r["close"]) for r in results)),
            "endings": dict(Counter(r["ending"] for r in results)),
            "worst_end_after_last_activity_s": round(max(quiet, default=0.0), 2),
            "unread_sessions_all_ended_after_s": round(unread_end_s, 2),
            "end_bound_s": SEND_TIMEOUT_S + IDLE_S + WS_END_SLACK_S,
            "sessions_left_open": _metric(server, "higgs_serve_ws_sessions"),
            "unended": codes["<no end within the bound>"]}


# ----------------------------------------------------------------------------- main
def run(quick: bool, seed: int, out: str | None) -> dict:
    started = now_iso()
    with tempfile.TemporaryDirectory(prefix="fuzz-surfaces-") as tmp:
        server = start_server(Path(tmp))
        try:
            hostile = rest_cases(server, quick) + ws_cases(server)
            if quick:  # the cases the test suite does not already make one by one
                hostile = [(name, step) for name, step in hostile if name in QUICK_CASES]
            cases = [measured(server, name, step) for name, step in hostile]
            rest_fuzz = measured(server, "schemathesis", lambda: _wrap(schemathesis_pass(
                server, 2 if quick else 40)))
            ws_fuzz = measured(server, "websocket fuzzer", lambda: _wrap(ws_fuzz_pass(
                server, 10 if quick else 300, seed)))
        finally:
            server.stop()
        tracebacks = server.tracebacks()
        log_tail = server.log_path.read_text(errors="replace")[-4000:] if tracebacks else ""
    every = cases + [rest_fuzz, ws_fuzz]
    single = [c for c in cases]
    worst_health = max(single, key=lambda c: c.worst_health_ms)
    worst_rss = max(single, key=lambda c: c.rss_peak_growth_mb)
    result = {
        **provenance("bench_fuzz_surfaces", started),
        "loadavg": os.getloadavg(), "quick": quick, "seed": seed,
        "server": {"model": "tiny (random weights)", "device": "cpu", "ws_idle_timeout_s": IDLE_S,
                   "send_timeout_s": SEND_TIMEOUT_S, "default_max_new_tokens": FRAMES},
        "summary": {
            "cases": len(cases) + rest_fuzz.extra["cases"] + ws_fuzz.extra["sessions"],
            "5xx": sum(c.server_errors for c in every) + rest_fuzz.extra["5xx"],
            "tracebacks_in_server_log": tracebacks,
            "worst_health_ms_single_hostile_request": worst_health.worst_health_ms,
            "worst_health_case": worst_health.name,
            "health_failures": sum(c.health_failures for c in every),
            "worst_rss_growth_mb": worst_rss.rss_peak_growth_mb,
            "worst_rss_case": worst_rss.name,
            "worst_rss_after_growth_mb": max(c.rss_after_growth_mb for c in single),
            "ws_worst_end_s": ws_fuzz.extra["worst_end_after_last_activity_s"],
            "ws_end_bound_s": ws_fuzz.extra["end_bound_s"],
        },
        "hostile_requests": [c.__dict__ for c in cases],
        "schemathesis": {**rest_fuzz.extra, "worst_health_ms": rest_fuzz.worst_health_ms},
        "websocket_fuzz": {**ws_fuzz.extra, "worst_health_ms": ws_fuzz.worst_health_ms},
        "server_log_tail_if_tracebacks": log_tail,
    }
    if out:
        write_json(out, result)
    return result


def _wrap(extra: dict) -> tuple[str, int, dict]:
    return "", extra.get("5xx", 0) + extra.get("internal_errors", 0), extra


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few cases per pass (the test suite's)")
    parser.add_argument("--seed", type=int, default=40, help="the WebSocket fuzzer's seed")
    parser.add_argument("--out", default=None, help="JSON result path (default: print only)")
    args = parser.parse_args(argv)
    result = run(args.quick, args.seed, args.out)
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
