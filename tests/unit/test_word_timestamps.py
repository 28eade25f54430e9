"""server/last_mile/word_timestamps.py, alone: sentences aligned in a worker process, delivered in order
on the response's timeline, failures reported as missing words, and the event loop never held
up by alignment (real speech with known word edges: tests/support/data)."""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import Future

import numpy as np
import pytest

from higgs_serve.alignment.pool import AlignerPool
from higgs_serve.errors import AlignmentError
from higgs_serve.server.last_mile.word_timestamps import WordTimestampTap
from support.aligned_speech import aligned_speech

ALIGNER = "pocketsphinx-en"


@pytest.fixture(scope="module")
def pool():
    pool = AlignerPool(workers=1)
    pool.start(ALIGNER).result(timeout=120)  # the model loads once, outside every measurement
    yield pool
    pool.shutdown()


def _feed(tap: WordTimestampTap, audio: np.ndarray, chunk: int = 4800) -> None:
    for start in range(0, len(audio), chunk):
        tap.push(audio[start:start + chunk])


def test_sentences_in_order_on_one_timeline_lagging_at_most_one(pool):
    speech = aligned_speech()
    rate, duration_s = speech.sample_rate_hz, len(speech.audio) / speech.sample_rate_hz

    async def scenario():
        tap = WordTimestampTap(pool, ALIGNER, rate)
        delivered = []
        for k in range(3):
            _feed(tap, speech.audio)
            tap.end_sentence(f"<|emotion:calm|>{speech.text}" if k == 1 else speech.text)
            # the next sentence takes a tenth of its duration to make (10x real time): by the
            # time it ends, every earlier sentence's words are out
            await asyncio.sleep(duration_s / 10)
            delivered += tap.ready()
            assert [s.index for s in delivered] == list(range(k + 1)), (k, tap.lagging)
        tap.finish()
        return delivered + [s async for s in tap.results()]

    sentences = asyncio.run(scenario())
    assert [s.index for s in sentences] == [0, 1, 2]
    errors = []
    for k, sentence in enumerate(sentences):
        assert sentence.offset_s == pytest.approx(k * duration_s)
        timeline = sentence.on_timeline()
        assert [w.word for w in timeline] == [w for w, _, _ in speech.truth]
        for word, (_, start, end) in zip(timeline, speech.truth):
            errors += [abs(word.start_s - (start + k * duration_s)), abs(word.end_s - (end + k * duration_s))]
            assert k * duration_s <= word.start_s <= word.end_s <= (k + 1) * duration_s
    assert np.mean(errors) <= 0.040


def test_results_wait_for_their_turn_and_failures_are_missing_words():
    """A fake pool whose futures the test completes: a later sentence done first waits for the
    earlier one; a failed alignment gives words=None and the next sentence is unaffected."""
    class ManualPool:
        def __init__(self):
            self.futures: list[Future] = []

        def submit(self, name, audio, rate, words):
            self.futures.append(Future())
            return self.futures[-1]

    async def scenario():
        manual = ManualPool()
        tap = WordTimestampTap(manual, ALIGNER, 24000)
        for text in ("one two", "three", " <|sfx:cough|> ", "four"):
            tap.push(np.zeros(24000, np.float32))
            tap.end_sentence(text)
        assert len(manual.futures) == 3  # a sentence without words needs no aligner
        manual.futures[1].set_result([])
        await asyncio.sleep(0)
        assert tap.ready() == []  # sentence 1 is done, 0 is not: nothing yet
        manual.futures[0].set_exception(AlignmentError("too short"))
        manual.futures[2].set_result([])
        await asyncio.sleep(0.01)
        tap.finish()
        return tap.ready() + [s async for s in tap.results()]

    sentences = asyncio.run(scenario())
    assert [s.index for s in sentences] == [0, 1, 2, 3]
    assert sentences[0].words is None and sentences[0].on_timeline() is None
    assert sentences[1].words == [] and sentences[2].words == [] and sentences[3].words == []
    assert [s.offset_s for s in sentences] == [0.0, 1.0, 2.0, 3.0]


def test_alignment_never_holds_up_the_event_loop(pool):
    """A long sentence (about 1 s of aligner CPU) is aligned while a ticker runs on the loop:
    PocketSphinx holds the GIL while it decodes, so only a separate process keeps the ticks
    coming (in a thread the loop would stall for the whole decode)."""
    speech = aligned_speech()
    long_audio = np.concatenate([speech.audio] * 10)
    long_text = " ".join([speech.text] * 10)

    async def scenario():
        tap = WordTimestampTap(pool, ALIGNER, speech.sample_rate_hz)
        gaps, stop = [], asyncio.Event()

        async def tick():
            last = time.perf_counter()
            while not stop.is_set():
                await asyncio.sleep(0.005)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        ticker = asyncio.create_task(tick())
        started = time.perf_counter()
        _feed(tap, long_audio)
        tap.end_sentence(long_text)
        (sentence,) = await tap.drain()
        took = time.perf_counter() - started
        stop.set()
        await ticker
        return sentence, took, max(gaps)

    sentence, took_s, max_gap_s = asyncio.run(scenario())
    assert sentence.words is not None and len(sentence.words) == 10 * len(speech.truth)
    assert max_gap_s < max(0.1, took_s / 3), (max_gap_s, took_s)


def test_close_cancels_what_is_queued():
    async def scenario():
        future = Future()

        class OnePool:
            def submit(self, *args):
                return future

        tap = WordTimestampTap(OnePool(), ALIGNER, 24000)
        tap.push(np.zeros(100, np.float32))
        tap.end_sentence("hello")
        tap.close()
        await asyncio.sleep(0)
        return [s async for s in tap.results()]

    assert asyncio.run(scenario()) == []


def test_speed_scales_every_time_and_metrics_see_each_alignment():
    """speed 2: the tap sees the engine's audio before the stretch, so offsets, durations and
    words are halved (the response's timeline); each alignment is reported once, failures flagged
    (and said why on SSE), each delivery's lag too."""
    from higgs_serve.alignment import WordTiming

    reports, lags = [], []

    class DonePool:
        def __init__(self):
            self.calls = 0

        def submit(self, name, audio, rate, words):
            self.calls += 1
            future = Future()
            if self.calls == 2:
                future.set_exception(AlignmentError("too short"))
            else:
                future.set_result([WordTiming(w, 0.2 * i, 0.2 * i + 0.1) for i, w in enumerate(words)])
            return future

    async def scenario():
        tap = WordTimestampTap(DonePool(), ALIGNER, 24000, speed=2.0,
                               on_aligned=lambda s, failed: reports.append(failed),
                               on_delivered=lags.append)
        for text in ("one two", "three"):
            tap.push(np.zeros(48000, np.float32))  # 2 s of engine audio, 1 s stretched
            tap.end_sentence(text)
        return await tap.drain()

    first, second = asyncio.run(scenario())
    assert (first.offset_s, first.duration_s, second.offset_s) == (0.0, 1.0, 1.0)
    assert [t for w in first.on_timeline() for t in (w.start_s, w.end_s)] == pytest.approx([0.0, 0.05, 0.1, 0.15])
    assert second.words is None and reports == [False, True]
    assert second.to_json() == {"index": 1, "start_ms": 1000, "end_ms": 2000, "words": None,
                                "error": {"code": "alignment_failed", "message": "too short"}}
    assert len(lags) == 2 and all(0 <= lag < 5 for lag in lags)


def test_header_keeps_every_word_and_follows_vllm_omnis_size_rule():
    """X-Word-Timestamps: compact ASCII JSON, a failed sentence's words with null times; past
    4096 bytes X-Word-Timestamps-Omitted says how big it was."""
    from higgs_serve.alignment import WordTiming
    from higgs_serve.server.last_mile.word_timestamps import MAX_HEADER_BYTES, SentenceWords, header_of

    aligned = SentenceWords(0, "Café au lait", 0.0, 1.0, [
        WordTiming("Café", 0.0, 0.3), WordTiming("au", 0.3, 0.4), WordTiming("lait", 0.4, 0.9)])
    failed = SentenceWords(1, "<|sfx:laugh|> Two words", 1.0, 0.5, None)
    header = header_of([aligned, failed])
    assert header["X-Word-Timestamps"].isascii()
    assert json.loads(header["X-Word-Timestamps"]) == [
        {"word": "Café", "start_ms": 0, "end_ms": 300}, {"word": "au", "start_ms": 300, "end_ms": 400},
        {"word": "lait", "start_ms": 400, "end_ms": 900},
        {"word": "Two", "start_ms": None, "end_ms": None}, {"word": "words", "start_ms": None, "end_ms": None}]
    many = SentenceWords(0, " ".join(["word"] * 200), 0.0, 60.0,
                         [WordTiming("word", 0.3 * i, 0.3 * i + 0.2) for i in range(200)])
    (name, value), = header_of([many]).items()
    size = len(json.dumps([w.to_json() for w in many.words], separators=(",", ":")))
    assert (name, value) == ("X-Word-Timestamps-Omitted", f"oversize; bytes={size}; limit={MAX_HEADER_BYTES}")
