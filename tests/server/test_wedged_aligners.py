"""Aligner processes that die or stop answering, through SSE (fake engine, real uvicorn, two
real aligner processes, --worker-timeout-s 1): six requests in flight keep every sentence's
words when one aligner is SIGKILLed or SIGSTOPped (its sentence retried on the other), the
audio never waits, and the worker is replaced; German text with `language: auto` is aligned
(issue 52). /metrics reports the words' lag and the aligners' restarts (issue 54)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import httpx
import pytest
from fake_engine import FakeEngine, fake_deploy
from live_server import fake_settings, metric, start_threaded_server

from higgs_serve.alignment import user_words

FRAMES = 100  # 4 s of audio a request
TEXT = "one two three four five six seven eight nine ten"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    engine = FakeEngine(deploy=fake_deploy(max_num_seqs=6, max_tokens=FRAMES), chunk_frames=25,
                        step_delay_s=0.01)
    live = start_threaded_server(engine, fake_settings(tmp_path_factory.mktemp("aligners"), max_queue=2,
                                                       alignment_workers=2, worker_timeout_s=1.0))
    live.app.state.server.aligner_pool.start("pocketsphinx-en").result(timeout=120)
    yield live
    live.stop()


def _body(text: str = TEXT, **extra) -> dict:
    return {"input": text, "seed": 3, "word_timestamps": True, "stream_format": "sse",
            "response_format": "pcm", "max_new_tokens": FRAMES, "min_new_tokens": FRAMES, **extra}


async def _words_of(client: httpx.AsyncClient, body: dict) -> dict:
    """The request's speech.words event, after checking its audio ended well."""
    events = []
    async with client.stream("POST", "/v1/audio/speech", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: "):]))
    assert events[-1]["type"] == "speech.audio.done"
    return next(e for e in events if e["type"] == "speech.words")


def _busy_pid(pool) -> int:
    deadline = time.monotonic() + 30
    while True:
        busy = [w for w in pool._workers if w.current is not None and w.current.audio is not None]
        if busy and busy[0].process is not None:
            return busy[0].process.pid
        assert time.monotonic() < deadline, "no alignment started"
        time.sleep(0.002)


def _six_with_a_signal(server, signum: int) -> tuple[list[dict], int]:
    pool = server.app.state.server.aligner_pool

    async def run():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            requests = [asyncio.ensure_future(_words_of(client, _body(seed=k))) for k in range(6)]
            victim = await asyncio.to_thread(_busy_pid, pool)
            os.kill(victim, signum)
            return await asyncio.wait_for(asyncio.gather(*requests), 60), victim

    return asyncio.run(run())


def test_a_killed_aligner_loses_no_sentence_and_is_replaced(server):
    pool = server.app.state.server.aligner_pool
    restarts = pool.restarts
    words, victim = _six_with_a_signal(server, signal.SIGKILL)
    assert all([w["word"] for w in event["words"]] == user_words(TEXT) for event in words), words
    deadline = time.monotonic() + 30
    while len(pool.pids()) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert victim not in pool.pids() and pool.restarts == restarts + 1


def test_a_stopped_aligner_is_timed_out_and_its_sentence_aligned_elsewhere(server):
    pool = server.app.state.server.aligner_pool
    restarts = pool.restarts
    started = time.monotonic()
    words, victim = _six_with_a_signal(server, signal.SIGSTOP)
    assert time.monotonic() - started < 30  # nobody waited for a SIGCONT
    assert all(event["words"] is not None and "error" not in event for event in words), words
    assert not os.path.exists(f"/proc/{victim}") and pool.restarts == restarts + 1
    with httpx.Client(base_url=server.url) as http:
        assert metric(http, "higgs_serve_aligner_restarts_total") >= 1
        assert metric(http, "higgs_serve_words_lag_seconds_count") >= 12


def test_german_with_language_auto_is_aligned_with_the_english_model(server):
    """docs/api.md#word-timestamps: `auto` aligns text in Latin letters (ß and umlauts
    included) as English."""
    text = "Straße Größe Fußball"

    async def run():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            return await _words_of(client, _body(text, language="auto"))

    event = asyncio.run(run())
    assert [w["word"] for w in event["words"]] == ["Straße", "Größe", "Fußball"]
    refused = httpx.post(f"{server.url}/v1/audio/speech", json=_body(text, language="German"), timeout=30)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "language"
