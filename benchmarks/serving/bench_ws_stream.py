"""Time to first audio on WS /v1/audio/speech/stream when text arrives at LLM speed.

Each session sends session.config, then the text `--chars` characters every `--interval-ms`
(an LLM's token stream), then session.close, and records: TTFA from the first input.text;
the time from the message that completed the first sentence (its terminator plus the
segmenter's look-ahead, text/incremental.py) to the first audio; the first audio.done; and
whether audio started before the text was complete. `--concurrency` sessions run at once.
Needs a running server (`higgs-serve serve ...`).

  higgs-serve serve /tmp/h4b --load-format dummy --port 8000 &
  python3 benchmarks/serving/bench_ws_stream.py --url ws://127.0.0.1:8000 --sessions 20 \\
      --concurrency 1 4 16 --out ws_stream.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import websockets

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from common import command_line, git_commit, markdown_table, mean, now_iso, percentile, write_json  # noqa: E402

from higgs_serve.text import IncrementalSegmenter  # noqa: E402

TEXT = ("Sure, here is a short answer to your question. The weather tomorrow will be mild, with "
        "light rain in the morning and sun after noon. Take an umbrella if you go out early. "
        "Anything else I can help with?")


def first_sentence_message(text: str, chars: int) -> int:
    """Index of the input.text message after which the server can release the first sentence."""
    segmenter = IncrementalSegmenter(max_chars=300)
    for i, start in enumerate(range(0, len(text), chars)):
        if segmenter.feed(text[start:start + chars]):
            return i
    return len(range(0, len(text), chars))  # only at the end (flush)


async def session(url: str, args) -> dict:
    pieces = [TEXT[i:i + args.chars] for i in range(0, len(TEXT), args.chars)]
    release_at = first_sentence_message(TEXT, args.chars)
    sent: list[float] = []
    async with websockets.connect(url, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.config", "response_format": "pcm",
                                  "max_new_tokens": args.frames, "seed": 1}))

        async def feed() -> None:
            for piece in pieces:
                await ws.send(json.dumps({"type": "input.text", "text": piece}))
                sent.append(time.perf_counter())
                await asyncio.sleep(args.interval_ms / 1e3)
            await ws.send(json.dumps({"type": "session.close"}))

        feeder = asyncio.create_task(feed())
        first_audio = first_done = None
        async for message in ws:
            now = time.perf_counter()
            if isinstance(message, bytes) and first_audio is None:
                first_audio = now
            elif isinstance(message, str) and json.loads(message)["type"] == "audio.done" \
                    and first_done is None:
                first_done = now
        await feeder
    return {"ttfa_ms": 1e3 * (first_audio - sent[0]),
            "after_sentence_ms": 1e3 * (first_audio - sent[min(release_at, len(sent) - 1)]),
            "first_done_ms": 1e3 * (first_done - sent[0]),
            "before_text_end": first_audio < sent[-1]}


async def run_level(url: str, args, concurrency: int) -> dict:
    results = []
    for start in range(0, args.sessions, concurrency):
        batch = min(concurrency, args.sessions - start)
        results += await asyncio.gather(*(session(url, args) for _ in range(batch)))
    row = {"concurrency": concurrency, "sessions": len(results),
           "audio_before_text_end": sum(r["before_text_end"] for r in results)}
    for key in ("ttfa_ms", "after_sentence_ms", "first_done_ms"):
        values = [r[key] for r in results]
        row[f"{key}_mean"] = mean(values)
        row[f"{key}_p90"] = percentile(values, 90)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="ws://127.0.0.1:8000")
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1])
    parser.add_argument("--chars", type=int, default=4, help="characters per input.text")
    parser.add_argument("--interval-ms", type=float, default=20.0)
    parser.add_argument("--frames", type=int, default=150, help="max_new_tokens per sentence")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    url = args.url.rstrip("/") + "/v1/audio/speech/stream"
    asyncio.run(session(url, args))  # warm-up
    rows = [asyncio.run(run_level(url, args, c)) for c in args.concurrency]
    print(markdown_table(rows, [
        ("concurrency", "c"), ("sessions", "sessions"), ("ttfa_ms_mean", "TTFA ms"),
        ("ttfa_ms_p90", "TTFA p90"), ("after_sentence_ms_mean", "sentence→audio ms"),
        ("after_sentence_ms_p90", "sentence→audio p90"), ("first_done_ms_mean", "1st done ms"),
        ("audio_before_text_end", "audio before text end")]))
    if args.out:
        write_json(args.out, {"bench": "ws_stream", "when": now_iso(), "commit": git_commit(),
                              "command": command_line(), "text_chars": len(TEXT), **vars(args),
                              "rows": rows})


if __name__ == "__main__":
    main()
