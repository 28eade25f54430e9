"""bench_serving.py's client: the fixed workload, one request (its retries when refused, its
audio's arrival times, SSE events), and the closed loop of c clients.

Each request streams raw 16-bit PCM over chunked HTTP by default (`stream: true, stream_format:
"audio", response_format: "pcm"`), asks for exactly N frames (`max_new_tokens = min_new_tokens =
N`: random weights never stop on their own) and carries a seed of its own. A request refused
with 429/503 is sent again after the server's Retry-After (serving/refusals.py); its TTFA, RTF
and latency count from its first try.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import functools
import json
import random
import ssl
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from serving.playback import gapless_start  # noqa: E402
from serving.refusals import RETRYABLE_STATUS, Refusal, parse_retry_after, retry_wait_s  # noqa: E402

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
    sent: float  # perf_counter seconds, of its first try
    frames: int = 0  # audio frames asked for (max_new_tokens = min_new_tokens)
    streamed: bool = True  # False: asked for the whole file (`--file-every`)
    status: int = 0  # of its last try
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
    refusals: list[Refusal] = field(default_factory=list)  # its refused tries, in order
    admitted_sent: float | None = None  # when its last try (the admitted one) was sent

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None and self.num_bytes > 0

    @property
    def gave_up(self) -> bool:
        """Refused on every try it made (--max-tries, or its timeout, ran out)."""
        return bool(self.refusals) and self.status in RETRYABLE_STATUS

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
        """From the first try (a refused request's wait included) to the first audio bytes."""
        return None if self.first_audio is None else self.first_audio - self.sent

    @property
    def admitted_ttfa_s(self) -> float | None:
        """From the admitted try alone: what the server's own queue and work cost."""
        sent = self.sent if self.admitted_sent is None else self.admitted_sent
        return None if self.first_audio is None else self.first_audio - sent

    @property
    def latency_s(self) -> float | None:
        return None if self.end is None else self.end - self.sent

    @property
    def gapless_s(self) -> float | None:
        start = gapless_start(self.arrivals, self.bytes_per_s)
        return None if start is None else start - self.sent


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
    """One request, sent again after each refusal (429/503) until it is admitted, `--max-tries`
    tries were refused, or the next wait would pass `--request-timeout` from the first try."""
    record = RequestRecord(index=index, sent=time.perf_counter(), frames=request_frames(index, args),
                           streamed=request_streamed(index, args),
                           response_format=args.response_format)
    body = request_body(index, args)
    while True:
        refusal = await _try_once(client, url, body, record)
        if refusal is None:
            break
        record.refusals.append(refusal)
        wait = retry_wait_s(refusal, len(record.refusals), args.retry_backoff_ms / 1e3)
        if (args.max_tries and len(record.refusals) >= args.max_tries) or \
                time.perf_counter() + wait - record.sent > args.request_timeout:
            break
        await asyncio.sleep(wait)
    record.end = time.perf_counter()
    return record


async def _try_once(client: httpx.AsyncClient, url: str, body: dict, record: RequestRecord) -> Refusal | None:
    """One try: the Refusal when the server refused it, else None with the answer in `record`."""
    sent = record.admitted_sent = time.perf_counter()
    record.error = None
    try:
        async with client.stream("POST", f"{url}/v1/audio/speech", json=body) as resp:
            record.status = resp.status_code
            if resp.status_code != 200:
                record.error = (await resp.aread()).decode(errors="replace")[:500]
                if resp.status_code in RETRYABLE_STATUS:
                    return Refusal(resp.status_code, time.perf_counter() - sent,
                                   parse_retry_after(resp.headers.get("retry-after")))
                return None
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
    return None


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


# ------------------------------------------------------------------------------ the closed loop
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
    """`concurrency` clients, each sending its next request as soon as its last one ended (a
    refused one: after its Retry-After, the same request again). Each client has a connection of
    its own: httpcore checks every connection of a pool whenever a request starts or a response
    closes, so one pool of c connections costs O(c) per request (at c = 256 that scan was ~75 %
    of the benchmark's event loop, and requests went out and were read seconds late; measured
    with py-spy, results README)."""
    queue = list(reversed(indices))
    records: list[RequestRecord] = []

    async def worker() -> None:
        async with http_client(args, 1) as client:
            while queue:
                records.append(await send_one(client, url, queue.pop(), args))

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(indices)))))
    return sorted(records, key=lambda r: r.index)
