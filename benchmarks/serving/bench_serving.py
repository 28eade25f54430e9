"""End-to-end serving benchmark: the real HTTP server in a subprocess, closed-loop streaming
clients at several concurrencies.

One server start per invocation (`python -m higgs_serve.cli serve MODEL ...`, ready when GET
/ready answers 200), then for each concurrency c: `--warmup` untimed requests, then
`--num-requests` measured ones from c closed-loop clients (each sends its next request as soon
as its last one finished). Every request streams raw 16-bit PCM over chunked HTTP
(`stream: true, stream_format: "audio", response_format: "pcm"`; `--response-format` streams
another format, `--no-stream-field` sends neither field, as OpenAI's clients do) and asks for exactly N frames
(`max_new_tokens = min_new_tokens = N`; random weights never stop on their own), one seed each.
Production-like mixes: `--frames-spread s` draws each request's N from frames·(1 ± s), and
`--file-every k` makes every k-th request a whole-file one (`stream: false`).

Metrics (docs/model.md#metrics, the usual definitions):
- TTFA: client time from sending the request to the first non-empty audio bytes; beside it the
  server's own mean TTFA over the level (its /metrics histogram: arrival to first chunk).
- RTF: end-to-end latency / audio duration (PCM bytes / (2 * sample rate)).
- audio s/s: total audio seconds / wall seconds of the measured window (first send to last end).
- underruns: a real-time player starts at the first audio byte and plays at 1x; when it has
  played everything received so far before the stream ended it stalls until the next bytes
  arrive. Reported: requests with >= 1 stall, total and worst stall seconds, and how many
  stalls came in the first second of audio (the chunk ramp) or later.
- codec: windows per codec call, the share of calls that replayed a CUDA graph, and the codec
  thread's busy fraction (the server's /metrics counters over the level).
- watermark (`--watermark on|off` starts the server with the mark on or off): the mark stage's
  busy fraction of the level, its chunks per call, and its busy milliseconds per audio second
  (where it runs: the codec's device), from the same counters; None when the mark is off.
- word timestamps (`--word-timestamps on`, with `--stream-format sse`: a raw stream asking for
  them waits for the whole audio, docs/api.md#word-timestamps): each request asks for them; per
  level the lag of its `speech.words` events behind the last audio delta, the words received,
  the server's alignment histogram and failures (/metrics), and the aligner processes' CPU per
  audio second (the server's child processes, /proc). Compare TTFA with an `--word-timestamps
  off` run of the same command (same stream format).
- time to gapless audio: client time from sending the request to the earliest moment a player
  could start and then play the whole stream at 1x without a stall (TTFA when nothing stalls;
  what a client that buffers before playing must wait).
- GPU memory: the largest nvidia-smi memory.used seen while the level ran (if nvidia-smi exists).
- server CPU: the server process's user + system CPU seconds over the level, from
  /proc/<pid>/stat (only when this tool started the server): cores busy (CPU s / wall s) and CPU
  ms per audio second; with the host's core count beside it, what encoding a format costs the host.
  Beside it, the same with the server's encoder processes (its children running
  higgs_serve.audio.encode_worker, --encode-processes) added, and their count.
- Formats other than pcm: audio seconds are the frames asked for (every request gets exactly
  its N frames), and a player's stalls are timed at the stream's mean byte rate.

Usage:
  PYTHONPATH=src python3 benchmarks/serving/bench_serving.py --model /tmp/h4b --load-format dummy \
      --deploy-config higgs_multimodal_qwen3_low_latency --concurrency 1 4 16 --out ll.json
  --url http://host:port benchmarks a server that is already running (no subprocess).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import functools
import json
import os
import random
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from common import (REPO_ROOT, command_line, device_description, git_commit, gpu_memory_used_mib,  # noqa: E402
                    markdown_table, mean, now_iso, percentile, write_json)

SAMPLE_RATE = 24_000  # used when the server sends no x-sample-rate header
BYTES_PER_SAMPLE = 2  # s16le mono
FRAME_SAMPLES = 960  # 40 ms at 24 kHz

# Fixed English workload: 50 sentences of 10-25 words, used in order (request i gets i mod 50).
SENTENCES = (
    "The morning train to the city was late again, so everyone waited on the cold platform.",
    "She opened the old wooden box and found a stack of letters tied with a blue ribbon.",
    "Please remember to water the plants on the balcony while I am away next week.",
    "The museum will stay open until nine tonight because of the new photography exhibition.",
    "After the storm passed, the children ran outside to jump in the deep puddles.",
    "Our team finished the project two days early and celebrated with pizza in the office.",
    "He tuned the guitar carefully before playing a quiet song for his grandmother.",
    "The river was so clear that we could see small silver fish swimming near the rocks.",
    "If you turn left at the bakery, the library is the tall building on your right.",
    "Scientists discovered a new species of frog in the rainforest during last summer's expedition.",
    "The coffee shop on the corner makes the best cinnamon rolls I have ever tasted.",
    "My neighbor is teaching his dog to bring the newspaper from the front gate every morning.",
    "We watched the sun slowly disappear behind the mountains while the air grew cooler.",
    "The meeting has been moved to Thursday afternoon, so please update your calendar accordingly.",
    "A gentle breeze carried the smell of fresh bread through the narrow streets of the village.",
    "The pilot announced that we would land twenty minutes ahead of schedule thanks to strong tailwinds.",
    "She practiced her speech in front of the mirror until she knew every word by heart.",
    "The old lighthouse has guided ships safely into the harbor for more than a hundred years.",
    "Could you tell me how long it takes to walk from the station to the concert hall?",
    "The garden was full of bright yellow tulips, red roses, and tall purple lavender.",
    "He forgot his umbrella at home and arrived at work completely soaked from the rain.",
    "Learning a new language takes patience, practice, and a willingness to make many mistakes.",
    "The baker wakes up at four every morning to prepare bread for the early customers.",
    "Our flight was delayed by three hours, so we explored the airport and read our books.",
    "The little boy proudly showed his drawing of a purple elephant to the whole class.",
    "Every autumn the leaves in the park turn gold and orange before they fall to the ground.",
    "The new bridge across the river will shorten the drive to the coast by almost an hour.",
    "She made a cup of tea, sat by the window, and watched the snow cover the quiet street.",
    "The orchestra rehearsed the final movement again and again until the timing was perfect.",
    "Remember to bring a warm jacket, because the nights in the desert can be surprisingly cold.",
    "The detective studied the muddy footprints and realized the thief had left through the garden.",
    "Fresh vegetables from the farmers market taste much better than the ones from the supermarket.",
    "The students built a small robot that can sort colored blocks into separate boxes.",
    "Grandfather told us stories about sailing across the ocean when he was a young man.",
    "The hotel receptionist kindly recommended a quiet restaurant just a few minutes down the road.",
    "Thunder rolled across the valley, and the horses moved closer together under the big oak tree.",
    "The software update fixed several bugs and made the application start noticeably faster.",
    "We planted tomatoes, peppers, and beans in the backyard garden at the beginning of spring.",
    "The cat curled up on the warm windowsill and slept through the entire afternoon.",
    "Please speak slowly and clearly, so that everyone in the back of the room can hear you.",
    "The marathon runners crossed the finish line exhausted but smiling at the cheering crowd.",
    "Her favorite book tells the story of a girl who travels through time to save her family.",
    "The chef added a pinch of salt, a little pepper, and fresh herbs to the simmering soup.",
    "The city council approved a plan to plant a thousand new trees along the main avenues.",
    "At the end of the long day, they sat around the campfire and sang their favorite songs.",
    "The mechanic explained that the strange noise came from a loose belt in the engine.",
    "Astronomers observed a bright comet passing close to the sun for the first time in decades.",
    "The volunteers cleaned the beach and collected more than two hundred bags of plastic waste.",
    "He wrote a short note to thank his teacher for all her help during the difficult year.",
    "The quiet hum of the refrigerator was the only sound in the kitchen late at night.",
)


# ------------------------------------------------------------------------------ one request
@dataclass
class RequestRecord:
    index: int
    sent: float  # perf_counter seconds
    frames: int = 0  # audio frames asked for (max_new_tokens = min_new_tokens)
    streamed: bool = True  # False: asked for the whole file (`--file-every`)
    status: int = 0
    error: str | None = None
    first_audio: float | None = None
    server_ttfa_ms: float | None = None  # the server's X-Time-To-First-Audio-Ms, where it sends one
    end: float | None = None
    num_bytes: int = 0
    sample_rate: int = SAMPLE_RATE
    response_format: str = "pcm"
    arrivals: list[tuple[float, int]] = field(default_factory=list)  # (time, bytes) per read
    words_at: float | None = None  # the last speech.words event (SSE with --word-timestamps on)
    words: int = 0  # word timestamps received (entries with times)

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None and self.num_bytes > 0

    @property
    def audio_s(self) -> float:
        if self.response_format != "pcm":  # compressed or 8-bit: the frames asked for
            return self.frames * FRAME_SAMPLES / SAMPLE_RATE
        return self.num_bytes / (BYTES_PER_SAMPLE * self.sample_rate)

    @property
    def bytes_per_s(self) -> float:
        """Bytes a 1x player consumes a second (pcm exactly, other formats at the mean rate)."""
        if self.response_format != "pcm":
            return self.num_bytes / self.audio_s if self.audio_s else 1.0
        return BYTES_PER_SAMPLE * self.sample_rate

    @property
    def ttfa_s(self) -> float | None:
        return None if self.first_audio is None else self.first_audio - self.sent

    @property
    def latency_s(self) -> float | None:
        return None if self.end is None else self.end - self.sent

    @property
    def gapless_s(self) -> float | None:
        start = gapless_start(self.arrivals, self.bytes_per_s)
        return None if start is None else start - self.sent


def playback_stalls(arrivals: list[tuple[float, int]], bytes_per_s: float) -> list[tuple[float, float]]:
    """(where, how long) of each stall of a real-time player fed by `arrivals` [(time, bytes)]:
    the seconds of audio it had played when it ran dry, and the seconds it waited.

    Playback starts when the first bytes arrive; the player runs dry at `play_end`; bytes that
    arrive later than that mean it stalled for the gap, then playback resumes at once.
    """
    stalls = []
    play_end = None
    received = 0.0  # seconds of audio before this read
    for t, n in arrivals:
        if n <= 0:
            continue
        duration = n / bytes_per_s
        if play_end is None:
            play_end = t + duration
        elif t > play_end:
            stalls.append((received, t - play_end))
            play_end = t + duration
        else:
            play_end += duration
        received += duration
    return stalls


def gapless_start(arrivals: list[tuple[float, int]], bytes_per_s: float) -> float | None:
    """The earliest start time from which a 1x player never stalls: every read must arrive
    before the audio received ahead of it has played, so start >= t_i - (bytes before i) / rate
    for every read i (the first read gives start >= its own time)."""
    start, received = None, 0
    for t, n in arrivals:
        if n <= 0:
            continue
        start = max(start if start is not None else t, t - received / bytes_per_s)
        received += n
    return start


def request_frames(index: int, args: argparse.Namespace) -> int:
    """Frames request `index` asks for: `--frames`, or with `--frames-spread` s a length drawn
    uniformly from frames·(1 ± s) (seeded per request, so runs repeat): production traffic ends
    at many lengths, and so at many final codec windows."""
    if not args.frames_spread:
        return args.frames
    u = random.Random(args.seed + index).uniform(-1.0, 1.0)
    return max(1, round(args.frames * (1.0 + args.frames_spread * u)))


def request_streamed(index: int, args: argparse.Namespace) -> bool:
    """Every `--file-every`-th request asks for the whole file instead of a stream (0: none)."""
    return not (args.file_every and index % args.file_every == args.file_every - 1)


def request_body(index: int, args: argparse.Namespace) -> dict:
    frames = request_frames(index, args)
    body = {
        "input": SENTENCES[index % len(SENTENCES)],
        "stream": True,
        "stream_format": args.stream_format,
        "response_format": args.response_format,
        "max_new_tokens": frames,
        "min_new_tokens": frames,
        "seed": args.seed + index,
    }
    if not request_streamed(index, args):
        body["stream"] = False
        del body["stream_format"]  # a streaming format on a file request is a 400
    elif args.no_stream_field:  # streamed all the same, wav and flac aside (docs/api.md#streaming)
        del body["stream"], body["stream_format"]
    if args.served_model_name:
        body["model"] = args.served_model_name
    if args.word_timestamps == "on":
        body["word_timestamps"] = True
    return body


async def send_one(client: httpx.AsyncClient, url: str, index: int, args: argparse.Namespace) -> RequestRecord:
    record = RequestRecord(index=index, sent=time.perf_counter(), frames=request_frames(index, args),
                           streamed=request_streamed(index, args),
                           response_format=args.response_format)
    try:
        async with client.stream("POST", f"{url}/v1/audio/speech", json=request_body(index, args)) as resp:
            record.status = resp.status_code
            if resp.status_code != 200:
                record.error = (await resp.aread()).decode(errors="replace")[:500]
                record.end = time.perf_counter()
                return record
            record.sample_rate = int(resp.headers.get("x-sample-rate", SAMPLE_RATE))
            if "x-time-to-first-audio-ms" in resp.headers:
                record.server_ttfa_ms = float(resp.headers["x-time-to-first-audio-ms"])
            if resp.headers.get("content-type", "").startswith("text/event-stream"):
                await _read_sse(resp, record)
            else:
                async for chunk in resp.aiter_raw():
                    if chunk:
                        _arrived(record, time.perf_counter(), len(chunk))
    except httpx.HTTPError as exc:  # recorded per request and counted as a failure
        record.error = f"{type(exc).__name__}: {exc}"
    record.end = time.perf_counter()
    return record


def _arrived(record: RequestRecord, now: float, num_bytes: int) -> None:
    if record.first_audio is None:
        record.first_audio = now
    record.arrivals.append((now, num_bytes))
    record.num_bytes += num_bytes


async def _read_sse(resp: httpx.Response, record: RequestRecord) -> None:
    """`--stream-format sse`: audio deltas (base64 of the format's bytes) counted as they come,
    speech.words events timed and counted, an error event recorded."""
    async for line in resp.aiter_lines():
        if not line.startswith("data: "):
            continue
        event = json.loads(line[len("data: "):])
        kind = event.get("type")
        if kind == "speech.audio.delta":
            _arrived(record, time.perf_counter(), len(base64.b64decode(event["audio"])))
        elif kind == "speech.words":
            record.words_at = time.perf_counter()
            record.words += sum(1 for w in event["words"] or () if w["start_ms"] is not None)
        elif kind == "speech.audio.error":
            record.error = json.dumps(event["error"])[:500]


# ------------------------------------------------------------------------------ one level
async def _poll_gpu_memory(peak: list[int], stop: asyncio.Event, interval_s: float) -> None:
    """Keep the largest total nvidia-smi memory.used (MiB) seen until `stop` is set."""
    while not stop.is_set():
        used = await asyncio.to_thread(gpu_memory_used_mib)
        if used is None:
            return
        peak[0] = max(peak[0], sum(used))
        try:
            await asyncio.wait_for(stop.wait(), timeout=interval_s)
        except asyncio.TimeoutError:
            pass


@functools.lru_cache(maxsize=1)
def _tls_context() -> ssl.SSLContext:
    """One TLS context for every client: building one loads the CA store (~30 ms), which a
    client per connection would otherwise repeat hundreds of times."""
    return ssl.create_default_context()


def http_client(args: argparse.Namespace, connections: int) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(args.request_timeout, connect=30.0),
                             verify=_tls_context())


async def closed_loop(url: str, indices: list[int], concurrency: int,
                      args: argparse.Namespace) -> list[RequestRecord]:
    """`concurrency` clients, each sending its next request as soon as its last one ended. Each
    client has a connection of its own: httpcore checks every connection of a pool whenever a
    request starts or a response closes, so one pool of c connections costs O(c) per request (at
    c = 256 that scan was ~75 % of the benchmark's event loop, and requests went out and were read
    seconds late; measured with py-spy, results README)."""
    queue = list(reversed(indices))
    records: list[RequestRecord] = []

    async def worker() -> None:
        async with http_client(args, 1) as client:
            while queue:
                records.append(await send_one(client, url, queue.pop(), args))

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(indices)))))
    return sorted(records, key=lambda r: r.index)


ENGINE_SERIES = ("higgs_serve_stage0_step_seconds_sum", "higgs_serve_stage0_step_seconds_count",
                 "higgs_serve_stage0_rows_total")
# The server's own TTFA (request arrival to first chunk): beside the client's TTFA it tells time
# spent in the server from time spent in the client and on the wire.
SERVER_TTFA_SERIES = ("higgs_serve_ttfa_seconds_sum", "higgs_serve_ttfa_seconds_count")
# Stage 1's batching: windows per codec call, and how much of the level the codec thread decoded.
CODEC_SERIES = ("higgs_serve_codec_calls_total", "higgs_serve_codec_windows_total",
                "higgs_serve_codec_graph_calls_total", "higgs_serve_codec_busy_seconds_total")
# How Stage 0's steps ran (step mode; for eager steps, launch tape or not): a level slower than the
# step benchmarks shows here whether its steps took the graphs and tapes they were measured with.
STEP_MODES = ("full", "piecewise", "local_mlp", "none")
EAGER_OUTCOMES = ("replay", "recorded", "void", "op_by_op")
STEP_KIND_SERIES = {**{f"stage0_steps_{m}": f'higgs_serve_stage0_steps_total{{mode="{m}"}}' for m in STEP_MODES},
                    **{f"eager_steps_{o}": f'higgs_serve_eager_steps_total{{outcome="{o}"}}' for o in EAGER_OUTCOMES}}
# The watermark stage (engine/mark_stage.py), present when the server marks audio.
WATERMARK_SERIES = ("higgs_serve_watermark_calls_total", "higgs_serve_watermark_chunks_total",
                    "higgs_serve_watermark_audio_seconds_total", "higgs_serve_watermark_busy_seconds_total")
# Word timestamps (server/last_mile/word_timestamps.py): a sentence's wait for its words, and failures.
ALIGNMENT_SERIES = ("higgs_serve_alignment_seconds_sum", "higgs_serve_alignment_seconds_count",
                    "higgs_serve_alignment_failures_total")
SCRAPED_SERIES = frozenset(ENGINE_SERIES + SERVER_TTFA_SERIES + CODEC_SERIES + WATERMARK_SERIES
                           + ALIGNMENT_SERIES + tuple(STEP_KIND_SERIES.values()))


async def engine_counters(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    """The Stage 0 step, TTFA and codec counters of the server's /metrics ({} if it has none:
    another server)."""
    try:
        text = (await client.get(f"{url}/metrics")).text
    except httpx.HTTPError:
        return {}
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in SCRAPED_SERIES:
            values[name] = float(value)
    return values


def counter_deltas(before: dict[str, float], after: dict[str, float], series: tuple[str, ...]) -> tuple | None:
    """How much each of `series` grew between two scrapes (None if either scrape lacks one)."""
    if not all(name in before and name in after for name in series):
        return None
    return tuple(after[n] - before[n] for n in series)


def engine_step_metrics(before: dict[str, float], after: dict[str, float]) -> dict:
    """Mean Stage 0 step wall time and rows per step over a level, from two /metrics scrapes."""
    deltas = counter_deltas(before, after, ENGINE_SERIES)
    if deltas is None:
        return {"engine_steps": None, "engine_step_ms_mean": None, "engine_rows_per_step": None}
    seconds, steps, rows = deltas
    return {"engine_steps": int(steps), "engine_step_ms_mean": 1e3 * seconds / steps if steps else None,
            "engine_rows_per_step": rows / steps if steps else None}


def server_ttfa_metrics(before: dict[str, float], after: dict[str, float]) -> dict:
    """Mean server-side TTFA over a level, from two /metrics scrapes (None without them)."""
    deltas = counter_deltas(before, after, SERVER_TTFA_SERIES)
    if deltas is None:
        return {"server_ttfa_ms_mean": None}
    seconds, count = deltas
    return {"server_ttfa_ms_mean": 1e3 * seconds / count if count else None}


def step_kind_metrics(before: dict[str, float], after: dict[str, float]) -> dict:
    """Stage 0 steps of a level per step mode, and its eager steps per launch-tape outcome (None
    where the server does not export the series)."""
    return {key: int(after[name] - before[name]) if name in before and name in after else None
            for key, name in STEP_KIND_SERIES.items()}


def codec_metrics(before: dict[str, float], after: dict[str, float], window_s: float) -> dict:
    """Stage 1 over a level, from two /metrics scrapes: windows per call, the share of calls that
    replayed a graph, and the codec thread's busy fraction of the window (None without them)."""
    deltas = counter_deltas(before, after, CODEC_SERIES)
    if deltas is None:
        return {"codec_windows_per_call": None, "codec_graph_call_fraction": None, "codec_busy_fraction": None}
    calls, windows, graph_calls, busy = deltas
    return {"codec_windows_per_call": windows / calls if calls else None,
            "codec_graph_call_fraction": graph_calls / calls if calls else None,
            "codec_busy_fraction": busy / window_s if window_s > 0 else None}


def watermark_metrics(before: dict[str, float], after: dict[str, float], window_s: float) -> dict:
    """The mark stage over a level: its busy fraction of the window, chunks per call, and busy
    milliseconds per second of audio it marked (None when the server does not mark)."""
    deltas = counter_deltas(before, after, WATERMARK_SERIES)
    if deltas is None:
        return {"watermark_busy_fraction": None, "watermark_chunks_per_call": None,
                "watermark_busy_ms_per_audio_s": None}
    calls, chunks, audio_s, busy = deltas
    return {"watermark_busy_fraction": busy / window_s if window_s > 0 else None,
            "watermark_chunks_per_call": chunks / calls if calls else None,
            "watermark_busy_ms_per_audio_s": 1e3 * busy / audio_s if audio_s else None}


def alignment_metrics(before: dict[str, float], after: dict[str, float], records: list[RequestRecord]) -> dict:
    """Word timestamps over a level: the client's lag from the last audio to the last words
    event, words received, and the server's alignment wait and failures (None when not asked)."""
    timed = [r for r in records if r.ok and r.words_at is not None and r.arrivals]
    lag = [1e3 * (r.words_at - r.arrivals[-1][0]) for r in timed]
    deltas = counter_deltas(before, after, ALIGNMENT_SERIES)
    seconds, count, failures = deltas if deltas is not None else (None, None, None)
    return {"words_events_requests": len(timed), "words_per_request_mean": mean([r.words for r in timed]),
            "words_lag_ms_p50": percentile(lag, 50), "words_lag_ms_p99": percentile(lag, 99),
            "server_alignment_ms_mean": 1e3 * seconds / count if count else None,
            "alignments": int(count) if count is not None else None,
            "alignment_failures": int(failures) if failures is not None else None}


def level_metrics(concurrency: int, records: list[RequestRecord], window_s: float) -> dict:
    """TTFA, gapless start and stalls over the streamed requests; RTF, latency and audio over all
    (whole-file requests, `--file-every`, also get their own latency)."""
    ok = [r for r in records if r.ok]
    streams = [r for r in ok if r.streamed]
    files = [r.latency_s for r in ok if not r.streamed]
    ttfa = [r.ttfa_s * 1e3 for r in streams]
    # the client's TTFA less the server's own, request by request: time before the server's
    # handler took the request and after its first audio left (network, HTTP, the client)
    outside = [r.ttfa_s * 1e3 - r.server_ttfa_ms for r in streams if r.server_ttfa_ms is not None]
    gapless = [r.gapless_s * 1e3 for r in streams]
    rtf = [r.latency_s / r.audio_s for r in ok]
    latency = [r.latency_s for r in ok]
    audio = sum(r.audio_s for r in ok)
    stalls = [playback_stalls(r.arrivals, r.bytes_per_s) for r in streams]
    return {
        "concurrency": concurrency,
        "requests": len(records),
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "errors": sorted({f"{r.status}: {r.error}" for r in records if not r.ok})[:5],
        "wrong_length": sum(1 for r in ok if r.response_format == "pcm"
                            and r.num_bytes != r.frames * FRAME_SAMPLES * BYTES_PER_SAMPLE),
        "window_s": window_s,
        "ttfa_ms_p50": percentile(ttfa, 50), "ttfa_ms_p90": percentile(ttfa, 90),
        "ttfa_ms_p99": percentile(ttfa, 99), "ttfa_ms_mean": mean(ttfa),
        "outside_server_ms_p50": percentile(outside, 50), "outside_server_ms_p99": percentile(outside, 99),
        "gapless_ms_p50": percentile(gapless, 50), "gapless_ms_p99": percentile(gapless, 99),
        "rtf_mean": mean(rtf), "rtf_p50": percentile(rtf, 50), "rtf_p99": percentile(rtf, 99),
        "latency_s_p50": percentile(latency, 50), "latency_s_p99": percentile(latency, 99),
        "audio_s_total": audio,
        "audio_s_per_s": audio / window_s if window_s > 0 else None,
        "requests_per_s": len(ok) / window_s if window_s > 0 else None,
        "underrun_requests": sum(1 for s in stalls if s),
        "stall_s_total": sum(length for s in stalls for _, length in s),
        "stall_s_max": max((length for s in stalls for _, length in s), default=0.0),
        # where streams ran dry: in the first chunks (the ramp after the first audio, where the
        # player's lead is thinnest) or later (steady state)
        "stalls_in_first_s": sum(1 for s in stalls for at, _ in s if at < 1.0),
        "stalls_later": sum(1 for s in stalls for at, _ in s if at >= 1.0),
        "chunks_per_request_mean": mean([len(r.arrivals) for r in streams]),
        "file_requests": len(files),
        "file_latency_s_p50": percentile(files, 50), "file_latency_s_p99": percentile(files, 99),
    }


def process_cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of process `pid` (all its threads), from /proc/<pid>/stat."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def descendants_cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of the live child processes of `pid`, recursively (the aligner
    workers and the encoder processes), from /proc/<pid>/task/*/children; None where /proc has no such process."""
    if pid is None or not Path(f"/proc/{pid}/task").is_dir():
        return None
    total, stack = 0.0, [pid]
    while stack:
        parent = stack.pop()
        try:
            tasks = list(Path(f"/proc/{parent}/task").iterdir())
            children = [int(c) for task in tasks for c in (task / "children").read_text().split()]
        except OSError:  # it ended meanwhile
            continue
        for child in children:
            stack.append(child)
            total += process_cpu_s(child) or 0.0
    return total


ENCODER_PROCESS_MODULE = "higgs_serve.audio.encode_worker"  # the server's encoder processes


def encoder_children(pid: int | None) -> list[int]:
    """The server's encoder processes (--encode-processes): its direct children running
    ENCODER_PROCESS_MODULE, found by scanning /proc (a front end's replicas are children too,
    and their own encoder processes grandchildren: neither is counted)."""
    if pid is None:
        return []
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            if ppid == pid and ENCODER_PROCESS_MODULE in (stat.parent / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue  # exited while we looked
    return sorted(found)


def children_cpu_s(pids: list[int]) -> dict[int, float]:
    return {pid: cpu for pid in pids if (cpu := process_cpu_s(pid)) is not None}


def server_cpu_metrics(cpu_before: float | None, cpu_after: float | None, window_s: float,
                       audio_s: float, children_before: dict[int, float] | None = None,
                       children_after: dict[int, float] | None = None) -> dict:
    """The server process's own CPU, and with its encoder processes' (children_*: pid -> CPU s;
    a process present at both ends counts; one replaced mid-level is left out)."""
    children_before, children_after = children_before or {}, children_after or {}
    if cpu_before is None or cpu_after is None or window_s <= 0:
        return {"server_cpu_cores": None, "server_cpu_ms_per_audio_s": None,
                "encoder_processes": None, "server_and_encoders_cpu_cores": None,
                "server_and_encoders_cpu_ms_per_audio_s": None}
    cpu = cpu_after - cpu_before
    kids = sum(children_after[pid] - children_before[pid]
               for pid in children_after if pid in children_before)
    return {"server_cpu_cores": cpu / window_s,
            "server_cpu_ms_per_audio_s": 1e3 * cpu / audio_s if audio_s else None,
            "encoder_processes": len(children_after),
            "server_and_encoders_cpu_cores": (cpu + kids) / window_s,
            "server_and_encoders_cpu_ms_per_audio_s": 1e3 * (cpu + kids) / audio_s if audio_s else None}


async def run_level(url: str, concurrency: int, args: argparse.Namespace, first_index: int,
                    warmup: int, server_pid: int | None = None) -> tuple[dict, int]:
    """`warmup` untimed requests, then the measured ones at one concurrency; returns (metrics,
    next request index)."""
    num = args.num_requests or max(2 * concurrency, 6)
    async with http_client(args, 2) as client:  # /metrics only: the requests have their own
        index = first_index
        if warmup:
            warm = await closed_loop(url, list(range(index, index + warmup)), concurrency, args)
            index += warmup
            bad = [r for r in warm if not r.ok]
            if bad:
                raise SystemExit(f"bench_serving: warm-up request failed at c={concurrency}: "
                                 f"{bad[0].status} {bad[0].error}")
        peak = [0]
        stop = asyncio.Event()
        poller = asyncio.create_task(_poll_gpu_memory(peak, stop, 1.0))
        counters_before = await engine_counters(client, url)
        children = encoder_children(server_pid)
        cpu_before, children_before = process_cpu_s(server_pid), children_cpu_s(children)
        descendants_before = descendants_cpu_s(server_pid)
        t0 = time.perf_counter()
        records = await closed_loop(url, list(range(index, index + num)), concurrency, args)
        window = max(r.end for r in records) - t0
        cpu_after = process_cpu_s(server_pid)
        children_after = children_cpu_s(encoder_children(server_pid))
        descendants_after = descendants_cpu_s(server_pid)
        counters_after = await engine_counters(client, url)
        stop.set()
        await poller
    metrics = level_metrics(concurrency, records, window)
    metrics.update(server_cpu_metrics(cpu_before, cpu_after, window, metrics["audio_s_total"],
                                      children_before, children_after))
    metrics.update(engine_step_metrics(counters_before, counters_after))
    metrics.update(server_ttfa_metrics(counters_before, counters_after))
    metrics.update(codec_metrics(counters_before, counters_after, window))
    metrics.update(watermark_metrics(counters_before, counters_after, window))
    metrics.update(alignment_metrics(counters_before, counters_after, records))
    # every child process's CPU (aligner workers and encoder processes alike)
    child = (descendants_after - descendants_before
             if None not in (descendants_before, descendants_after) else None)
    metrics["server_children_cpu_ms_per_audio_s"] = (1e3 * child / metrics["audio_s_total"]
                                                     if child is not None and metrics["audio_s_total"] else None)
    metrics.update(step_kind_metrics(counters_before, counters_after))
    metrics["gpu_mem_used_mib_max"] = peak[0] or None
    return metrics, index + num


# ------------------------------------------------------------------------------ server process
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(args: argparse.Namespace, port: int) -> list[str]:
    cmd = [sys.executable, "-m", "higgs_serve.cli", "--log-level", args.server_log_level, "serve", args.model,
           "--host", "127.0.0.1", "--port", str(port), "--load-format", args.load_format,
           "--max-queue", str(max(args.concurrency) + 8)]
    if args.deploy_config:
        cmd += ["--deploy-config", args.deploy_config]
    if args.device:
        cmd += ["--device", args.device]
    if args.dtype:
        cmd += ["--dtype", args.dtype]
    if args.watermark:
        cmd += ["--watermark", args.watermark]
    return cmd + args.server_arg


def _log_tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def wait_ready(proc: subprocess.Popen, url: str, timeout_s: float, log_path: Path) -> float:
    """Seconds until GET /ready answered 200; exits with the log's tail if the server died."""
    t0 = time.perf_counter()
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"bench_serving: the server exited with {proc.returncode} before it was ready; "
                             f"log {log_path}:\n{_log_tail(log_path)}")
        try:
            if httpx.get(f"{url}/ready", timeout=5.0).status_code == 200:
                return time.perf_counter() - t0
        except httpx.HTTPError:
            pass  # not listening yet
        if time.perf_counter() - t0 > timeout_s:
            raise SystemExit(f"bench_serving: the server was not ready after {timeout_s:.0f} s; "
                             f"log {log_path}:\n{_log_tail(log_path)}")
        time.sleep(0.5)


def stop_server(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.terminate()  # SIGTERM: uvicorn shuts down gracefully
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


# ------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="model directory or hub id (required unless --url)")
    p.add_argument("--url", default=None, help="benchmark an already running server instead of starting one")
    p.add_argument("--deploy-config", default=None, help="deploy YAML path or shipped profile name")
    p.add_argument("--label", default=None, help="name of this run in tables and plots (default: the deploy config)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--num-requests", type=int, default=None, help="measured requests per level (default max(2c, 6))")
    p.add_argument("--warmup", type=int, default=2,
                   help="untimed requests before the first level (graphs are captured at start-up, so "
                        "later levels need none)")
    p.add_argument("--frames", type=int, default=250, help="audio frames per request (25 = 1 s)")
    p.add_argument("--file-every", type=int, default=0,
                   help="every N-th request asks for the whole file (stream: false) instead of a stream; "
                        "streaming metrics cover the streamed ones (0: all streamed)")
    p.add_argument("--frames-spread", type=float, default=0.0,
                   help="draw each request's frames uniformly from frames*(1 +- this), seeded per request "
                        "(0: all --frames)")
    p.add_argument("--seed", type=int, default=1234, help="request i uses seed + i")
    p.add_argument("--response-format", dest="response_formats", nargs="+", default=["pcm"],
                   choices=["pcm", "wav", "flac", "mp3", "opus", "aac", "ulaw", "alaw"],
                   help="the format requests stream; several: each concurrency level runs once per "
                        "format, in the order given, on the same server (ratios side by side)")
    p.add_argument("--server-pid", type=int, default=None,
                   help="with --url: read this process's CPU from /proc per level (e.g. a front end)")
    p.add_argument("--no-stream-field", action="store_true",
                   help="send neither stream nor stream_format (an OpenAI client's request; it "
                        "streams all the same, but in wav and flac, where it is a file)")
    p.add_argument("--load-format", choices=["auto", "dummy"], default="auto")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--served-model-name", default=None, help="sent as `model` (default: omitted)")
    p.add_argument("--port", type=int, default=0, help="server port (0: a free one)")
    p.add_argument("--watermark", choices=["on", "off"], default=None,
                   help="start the server with the watermark on or off (default: the profile's, on)")
    p.add_argument("--stream-format", choices=["audio", "sse"], default="audio",
                   help="streamed requests as raw bytes of the format (audio) or SSE events (sse)")
    p.add_argument("--word-timestamps", choices=["on", "off"], default="off",
                   help="on: every request asks for word timestamps (needs --stream-format sse: a raw "
                        "stream asking for them waits for the whole audio); off: the field is left out")
    p.add_argument("--server-arg", action="append", default=[], help="extra argument for `serve` (repeatable)")
    p.add_argument("--server-log", default=None, help="server stdout/stderr file (default: a temp file)")
    p.add_argument("--server-log-level", default="WARNING")
    p.add_argument("--ready-timeout", type=float, default=900.0, help="seconds to wait for /ready")
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--max-minutes", type=float, default=None,
                   help="start no new level after this many minutes (the rest are listed as skipped)")
    p.add_argument("--out", default=None, help="write the JSON here (rewritten after every level)")
    args = p.parse_args(argv)
    if args.url is None and args.model is None:
        p.error("--model is required (or --url for a running server)")
    if min(args.concurrency) < 1 or args.frames < 1 or args.warmup < 0:
        p.error("--concurrency and --frames must be >= 1, --warmup >= 0")
    if not 0.0 <= args.frames_spread < 1.0:
        p.error("--frames-spread must be in [0, 1)")
    if args.file_every < 0:
        p.error("--file-every must be >= 0")
    if args.word_timestamps == "on" and args.stream_format != "sse":
        p.error("--word-timestamps on needs --stream-format sse (a raw stream asking for timestamps "
                "waits for the whole audio, so its TTFA would be the whole request)")
    args.response_format = args.response_formats[0]  # a level's own format replaces it (main)
    return args


def print_table(result: dict) -> None:
    spread = result["settings"].get("frames_spread") or 0
    frames = f"{result['settings']['frames']}" + (f" ± {spread:.0%}" if spread else "")
    print(f"\nServing benchmark: {result['label']} ({frames} frames/request, "
          f"{', '.join(result['settings']['response_format'])}, "
          f"server ready in {result['server']['ready_s'] or 0:.1f} s)\n")
    print(markdown_table(result["levels"], [
        ("concurrency", "c"), ("response_format", "format"), ("completed", "ok"), ("failed", "failed"), ("ttfa_ms_p50", "TTFA p50 ms"),
        ("ttfa_ms_p90", "p90"), ("ttfa_ms_p99", "p99"), ("server_ttfa_ms_mean", "server TTFA mean ms"), ("outside_server_ms_p50", "outside server p50 ms"), ("rtf_mean", "RTF mean"), ("rtf_p50", "p50"),
        ("rtf_p99", "p99"), ("audio_s_per_s", "audio s/s"), ("requests_per_s", "req/s"),
        ("underrun_requests", "underrun req"), ("stall_s_total", "stall s"), ("stalls_in_first_s", "stalls in 1st s"),
        ("gapless_ms_p50", "gapless p50 ms"),
        ("engine_step_ms_mean", "step ms"), ("engine_rows_per_step", "rows/step"),
        ("codec_windows_per_call", "codec windows/call"), ("codec_busy_fraction", "codec busy"),
        ("watermark_busy_fraction", "mark busy"), ("watermark_busy_ms_per_audio_s", "mark ms/audio s"),
        ("words_lag_ms_p50", "words lag p50 ms"), ("server_alignment_ms_mean", "align ms mean"),
        ("alignment_failures", "align failures"), ("server_children_cpu_ms_per_audio_s", "child procs CPU ms/audio s"),
        ("gpu_mem_used_mib_max", "GPU MiB"),
        ("server_cpu_cores", "server cores"), ("server_cpu_ms_per_audio_s", "server CPU ms/audio s"),
        ("server_and_encoders_cpu_cores", "+ encoder procs cores"),
    ]))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    proc = None
    log_path = None
    url = args.url
    server_cmd = None
    if url is None:
        port = args.port or free_port()
        url = f"http://127.0.0.1:{port}"
        log_path = Path(args.server_log or tempfile.mkstemp(prefix="bench_serving_", suffix=".log")[1])
        env = dict(os.environ)
        # the server imports higgs_serve from src/ when the package is not installed (GPU machine)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(REPO_ROOT / "src")) if p)
        server_cmd = server_command(args, port)
        with open(log_path, "ab") as log_file:
            proc = subprocess.Popen(server_cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env)
    result = {
        "tool": "bench_serving",
        "label": args.label or args.deploy_config or "default",
        "command": command_line(),
        "git_commit": git_commit(),
        "device": device_description(),
        "started_at": now_iso(),
        "finished_at": None,
        "settings": {"model": args.model, "deploy_config": args.deploy_config, "load_format": args.load_format,
                     "frames": args.frames, "frames_spread": args.frames_spread, "file_every": args.file_every,
                     "warmup": args.warmup, "num_requests": args.num_requests,
                     "concurrency": args.concurrency, "seed": args.seed, "url": args.url,
                     "watermark": args.watermark, "response_format": args.response_formats,
                     "stream_format": args.stream_format, "word_timestamps": args.word_timestamps,
                     "server_pid": args.server_pid,
                     "no_stream_field": args.no_stream_field, "host_cores": os.cpu_count()},
        "server": {"command": server_cmd, "ready_s": None, "log": str(log_path) if log_path else None,
                   "exit_code": None},
        "levels": [],
        "skipped_concurrency": [],
    }
    try:
        if proc is not None:
            result["server"]["ready_s"] = wait_ready(proc, url, args.ready_timeout, log_path)
            print(f"server ready at {url} after {result['server']['ready_s']:.1f} s", flush=True)
        index = 0
        server_pid = proc.pid if proc is not None else args.server_pid
        for concurrency, response_format in ((c, f) for c in args.concurrency
                                             for f in args.response_formats):
            if args.max_minutes is not None and time.perf_counter() - t_start > 60 * args.max_minutes:
                if concurrency not in result["skipped_concurrency"]:
                    result["skipped_concurrency"].append(concurrency)
                continue
            warmup = args.warmup if not result["levels"] else 0
            level_args = argparse.Namespace(**{**vars(args), "response_format": response_format})
            metrics, index = asyncio.run(run_level(url, concurrency, level_args, index, warmup,
                                                   server_pid))
            metrics["response_format"] = response_format
            result["levels"].append(metrics)
            print(f"c={concurrency} {response_format}: {metrics['completed']}/{metrics['requests']} ok, "
                  f"TTFA p50 {metrics['ttfa_ms_p50'] or 0:.0f} ms, RTF mean {metrics['rtf_mean'] or 0:.3f}, "
                  f"{metrics['audio_s_per_s'] or 0:.1f} audio s/s", flush=True)
            if args.out:  # after every level, so a run cut short still leaves its numbers
                write_json(args.out, result)
    finally:
        if proc is not None:
            result["server"]["exit_code"] = stop_server(proc)
    result["finished_at"] = now_iso()
    if args.out:
        write_json(args.out, result)
    if result["skipped_concurrency"]:
        print(f"skipped (--max-minutes {args.max_minutes}): c = {result['skipped_concurrency']}")
    print_table(result)
    return 1 if any(level["failed"] for level in result["levels"]) else 0


if __name__ == "__main__":
    sys.exit(main())
