"""WS /v1/audio/speech/stream against the real engine (tiny checkpoint) behind real uvicorn,
driven by a real `websockets` client.

Covered: an LLM-like token stream (4 characters every 20 ms) gets audio before its text is
complete, one audio.done per sentence, and the same audio as the same text over HTTP; the
session options (stream_audio, audio_transport, protocol); malformed messages answered with
`error` while the session goes on; a disconnect frees the engine at once; the idle timeout;
auth (header and api_key query) and the admission gate.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time

import httpx
import pytest
import websockets
from live_engine import start_live_engine_server
from live_server import metric

from higgs_serve.server.settings import ServerSettings

FRAMES = 6
SEED = 21
SENTENCES = [f"Sentence number {i} is here." for i in range(5)]  # 26 chars: one segment each
TEXT = " ".join(SENTENCES)
CONFIG = {"type": "session.config", "response_format": "pcm", "max_new_tokens": FRAMES,
          "seed": SEED}
IDLE_S = 1.5


@pytest.fixture(scope="module")
def live(tiny_model_dir, tmp_path_factory):
    settings = ServerSettings(served_model_name="higgs-tiny", segment_max_chars=40,
                              voices_dir=tmp_path_factory.mktemp("voices"), max_queue=2,
                              max_input_chars=2000, ws_idle_timeout_s=IDLE_S)
    server = start_live_engine_server(tiny_model_dir, settings)
    yield server
    server.stop()


def _ws_url(live, query: str = "") -> str:
    return live.url.replace("http://", "ws://") + "/v1/audio/speech/stream" + query


async def _receive_all(ws) -> tuple[list[dict], bytes, list[float]]:
    """Every event until the server closes: (json events, binary audio, arrival times)."""
    events, audio, times = [], b"", []
    while True:
        try:
            message = await ws.recv()
        except websockets.ConnectionClosed:  # any close code: the caller checks ws.close_code
            break
        times.append(time.perf_counter())
        if isinstance(message, bytes):
            audio += message
            events.append({"type": "<binary>", "bytes": len(message), "t": times[-1]})
        else:
            events.append({**json.loads(message), "t": times[-1]})
    return events, audio, times


async def _llm_session(url: str, config: dict, text: str, end: str = "session.close"):
    async with websockets.connect(url) as ws:
        await ws.send(json.dumps(config))

        async def feed() -> float:
            for i in range(0, len(text), 4):
                await ws.send(json.dumps({"type": "input.text", "text": text[i:i + 4]}))
                await asyncio.sleep(0.02)
            done_at = time.perf_counter()
            await ws.send(json.dumps({"type": end}))
            return done_at

        feeder = asyncio.create_task(feed())
        events, audio, _ = await _receive_all(ws)
        return events, audio, await feeder


def test_llm_stream_speaks_each_sentence_as_it_completes(live):
    before = metric(httpx.Client(base_url=live.url), 'higgs_serve_requests_total{outcome="length"}')
    events, audio, text_done_at = asyncio.run(_llm_session(_ws_url(live), CONFIG, TEXT))
    kinds = [e["type"] for e in events]
    first_audio = next(e["t"] for e in events if e["type"] == "<binary>")
    assert first_audio < text_done_at  # audio began while the text was still arriving
    starts = [e for e in events if e["type"] == "audio.start"]
    dones = [e for e in events if e["type"] == "audio.done"]
    assert [e["sentence_text"] for e in starts] == SENTENCES
    assert [e["sentence_index"] for e in dones] == list(range(len(SENTENCES)))
    assert kinds[-1] == "session.done" and events[-1]["total_sentences"] == len(SENTENCES)
    assert sum(e["total_bytes"] for e in dones) == len(audio) == len(SENTENCES) * FRAMES * 1920
    for a, b in zip(dones, dones[1:]):
        assert a["end_s"] == b["start_s"] and a["char_end"] < b["char_start"]
    # the same text over HTTP (long-form: one segment per sentence, seed + k) is the same audio
    with httpx.Client(base_url=live.url, timeout=60) as http:
        r = http.post("/v1/audio/speech", json={"input": TEXT, "response_format": "pcm",
                                                "stream": True, "max_new_tokens": FRAMES,
                                                "seed": SEED})
        assert r.status_code == 200 and r.content == audio
        after = metric(http, 'higgs_serve_requests_total{outcome="length"}')
    # a session counts each sentence (each is admitted on its own); the long-form POST counts once
    assert after - before == len(SENTENCES) + 1


def test_session_options(live):
    async def run():
        url = _ws_url(live)
        # stream_audio false + base64: one audio.chunk per sentence, no binary messages
        config = {**CONFIG, "stream_audio": False, "audio_transport": "base64",
                  "max_new_tokens": 30}
        async with websockets.connect(url) as ws:
            await ws.send(json.dumps(config))
            await ws.send(json.dumps({"type": "input.text", "text": "One sentence only."}))
            await ws.send(json.dumps({"type": "session.close"}))
            events, audio, _ = await _receive_all(ws)
        chunks = [e for e in events if e["type"] == "audio.chunk"]
        assert audio == b"" and len(chunks) == 1
        assert len(base64.b64decode(chunks[0]["audio"])) == 30 * 1920
        # streamed (the default): the same sentence in several binary messages
        async with websockets.connect(url) as ws:
            await ws.send(json.dumps({**CONFIG, "max_new_tokens": 30}))
            await ws.send(json.dumps({"type": "input.text", "text": "One sentence only."}))
            await ws.send(json.dumps({"type": "session.close"}))
            events, audio, _ = await _receive_all(ws)
        assert sum(e["type"] == "<binary>" for e in events) > 1 and len(audio) == 30 * 1920
        # sglang-omni: session.configured, and input.done ends the session
        async with websockets.connect(url) as ws:
            await ws.send(json.dumps({**CONFIG, "protocol": "sglang-omni"}))
            await ws.send(json.dumps({"type": "input.text", "text": "Hi there. Bye"}))
            await ws.send(json.dumps({"type": "input.done"}))
            events, _, _ = await _receive_all(ws)
        kinds = [e["type"] for e in events]
        assert kinds[0] == "session.configured" and kinds[-1] == "session.done"
        assert kinds.count("audio.done") == 2
        # vllm-omni: input.done flushes and the session stays open for more
        async with websockets.connect(url) as ws:
            await ws.send(json.dumps(CONFIG))
            await ws.send(json.dumps({"type": "input.text", "text": "No period here"}))
            await ws.send(json.dumps({"type": "input.done"}))
            await ws.send(json.dumps({"type": "input.text", "text": "Second turn."}))
            await ws.send(json.dumps({"type": "session.close"}))
            events, _, _ = await _receive_all(ws)
        assert [e["sentence_text"] for e in events if e["type"] == "audio.start"] == [
            "No period here", "Second turn."]
        # wav: each sentence is its own streaming WAV (header first)
        async with websockets.connect(url) as ws:
            await ws.send(json.dumps({**CONFIG, "response_format": "wav"}))
            await ws.send(json.dumps({"type": "input.text", "text": "First one. Second one."}))
            await ws.send(json.dumps({"type": "session.close"}))
            events, audio, _ = await _receive_all(ws)
        assert audio.count(b"RIFF") == 2 and audio.startswith(b"RIFF")

    asyncio.run(run())


def test_session_sample_rate_resamples_each_sentence(live):
    """sample_rate in session.config is honoured, as over REST: audio.start names the rate and
    each sentence's pcm is that rate's length (30 frames of 40 ms at 16 kHz: 19,200 samples)."""
    async def run():
        async with websockets.connect(_ws_url(live)) as ws:
            await ws.send(json.dumps({**CONFIG, "max_new_tokens": 30, "sample_rate": 16000}))
            await ws.send(json.dumps({"type": "input.text", "text": "First one. Second one."}))
            await ws.send(json.dumps({"type": "session.close"}))
            return await _receive_all(ws)

    events, audio, _ = asyncio.run(run())
    starts = [e for e in events if e["type"] == "audio.start"]
    dones = [e for e in events if e["type"] == "audio.done"]
    assert [e["sample_rate"] for e in starts] == [16000, 16000]
    assert [e["total_bytes"] for e in dones] == [30 * 640 * 2, 30 * 640 * 2]
    assert len(audio) == 2 * 30 * 640 * 2


def test_sglang_session_configured_names_the_session_rate(live):
    """protocol sglang-omni: session.configured says the rate the audio comes at (it said the
    engine's 24 kHz while every sentence came resampled to the session's sample_rate)."""
    async def run():
        async with websockets.connect(_ws_url(live)) as ws:
            await ws.send(json.dumps({**CONFIG, "protocol": "sglang-omni", "sample_rate": 16000}))
            await ws.send(json.dumps({"type": "input.done"}))
            return await _receive_all(ws)

    events, _, _ = asyncio.run(run())
    assert events[0]["type"] == "session.configured"
    assert (events[0]["sample_rate"], events[0]["format"]) == (16000, "pcm")


def test_malformed_messages_get_errors_and_the_session_goes_on(live):
    cap = live.app.state.server.settings.max_ws_message_bytes

    async def run():
        async with websockets.connect(_ws_url(live)) as ws:
            bad = [
                "{not json",
                json.dumps([1, 2]),
                json.dumps({"type": "input.bogus"}),
                json.dumps({"type": "input.text", "text": "before config."}),
                json.dumps({"type": "session.config", "temperature": "hot"}),
                json.dumps({"type": "session.config", "input": "no"}),
                json.dumps({"type": "session.config", "stream_audio": "yes"}),
                json.dumps({"type": "session.config", "voice": "alloy"}),
                json.dumps({"type": "input.text", "text": "x" * cap}),  # over the message cap
                "[" * 99_999,  # issue 40 item 4: a traceback and an abrupt 1006 close before
                json.dumps({"type": "session.config", "sample_rate": 0}),  # item 9
            ]
            for message in bad:
                await ws.send(message)
            await ws.send(b"\x00\x01")
            await ws.send(json.dumps(CONFIG))
            await ws.send(json.dumps(CONFIG))  # twice
            await ws.send(json.dumps({"type": "input.text", "text": 5}))
            await ws.send(json.dumps({"type": "input.text", "text": "Still alive."}))
            await ws.send(json.dumps({"type": "session.close"}))
            events, audio, _ = await _receive_all(ws)
        errors = [e for e in events if e["type"] == "error"]
        codes = [e["code"] for e in errors]
        assert codes == ["invalid_json", "invalid_message", "unknown_type", "not_configured",
                         *["invalid_request_error"] * 4, "message_too_large", "invalid_json",
                         "invalid_request_error", "invalid_message", "already_configured",
                         "invalid_message"], codes
        params = [e["error"]["param"] for e in errors]
        # a bad session.config names its field, with the REST message
        assert params[4:8] == ["temperature", "input", "stream_audio", "voice"]
        assert params[10] == "sample_rate"
        assert "alloy" in errors[7]["message"] and params[-1] == "text"
        assert events[-1]["type"] == "session.done" and events[-1]["total_sentences"] == 1
        assert len(audio) == FRAMES * 1920
        assert httpx.get(f"{live.url}/health").status_code == 200

    asyncio.run(run())


def test_disconnect_frees_the_engine_at_once(live):
    core = live.engine.inner.core
    gate = live.app.state.server.gate

    async def run():
        ws = await websockets.connect(_ws_url(live))
        await ws.send(json.dumps({**CONFIG, "max_new_tokens": 200}))
        await ws.send(json.dumps({"type": "input.text", "text": "A long one. And more"}))
        while not isinstance(await ws.recv(), bytes):  # audio is flowing: a slot is busy
            pass
        assert core.stats()["num_active"] == 1 and gate.in_flight == 1
        assert metric(httpx.Client(base_url=live.url), "higgs_serve_ws_sessions") == 1
        ws.transport.abort()  # drop the connection, no close handshake
        steps = core.counters.steps
        deadline = time.monotonic() + 5
        while core.stats()["num_active"] or gate.in_flight:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.005)
        return core.counters.steps - steps

    steps_after = asyncio.run(run())
    deadline = time.monotonic() + 5
    while metric(httpx.Client(base_url=live.url), "higgs_serve_ws_sessions") != 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    # counted from the client's side: the server's noticing the closed socket, the step in
    # flight and this loop's 5 ms polling included (seen: 0-2 of the 200 the sentence had left)
    assert steps_after <= 3
    assert core.stats()["num_running"] == 0


def test_sentence_outcomes_count_as_rest_requests_do(live):
    """A sentence the engine refuses (min_new_tokens above its frame cap) counts "invalid" (it
    counted "error"); one cut by the client leaving counts "abort" (it counted nothing)."""
    http = httpx.Client(base_url=live.url)
    counts = {o: metric(http, f'higgs_serve_requests_total{{outcome="{o}"}}')
              for o in ("invalid", "error", "abort")}

    async def run():
        async with websockets.connect(_ws_url(live)) as ws:
            await ws.send(json.dumps({**CONFIG, "max_new_tokens": 200, "min_new_tokens": 200}))
            await ws.send(json.dumps({"type": "input.text", "text": "Hi."}))
            await ws.send(json.dumps({"type": "session.close"}))
            events, _, _ = await _receive_all(ws)
        errors = [e for e in events if e["type"] == "error"]
        assert [e["error"]["param"] for e in errors] == ["min_new_tokens"], events
        ws = await websockets.connect(_ws_url(live))
        await ws.send(json.dumps({**CONFIG, "max_new_tokens": 200}))
        await ws.send(json.dumps({"type": "input.text", "text": "A long one. And more"}))
        while not isinstance(await ws.recv(), bytes):  # audio is flowing
            pass
        ws.transport.abort()

    asyncio.run(run())
    deadline = time.monotonic() + 5
    while live.app.state.server.gate.in_flight:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    after = {o: metric(http, f'higgs_serve_requests_total{{outcome="{o}"}}') for o in counts}
    assert after == {"invalid": counts["invalid"] + 1, "error": counts["error"],
                     "abort": counts["abort"] + 1}


def test_text_waiting_to_be_spoken_is_bounded(live):
    gate = live.app.state.server.gate

    async def run():
        ws = await websockets.connect(_ws_url(live))
        await ws.send(json.dumps({**CONFIG, "max_new_tokens": 200}))
        chunk = "Words to speak later. " * 40  # 880 characters; the limit is 2000
        for _ in range(3):
            await ws.send(json.dumps({"type": "input.text", "text": chunk}))
        while True:
            message = await ws.recv()
            if isinstance(message, str) and json.loads(message)["type"] == "error":
                ws.transport.abort()
                return json.loads(message)

    error = asyncio.run(run())
    assert error["code"] == "input_backlog" and error["error"]["param"] == "text"
    deadline = time.monotonic() + 5
    while gate.in_flight:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_idle_session_is_closed(live):
    """No message and nothing to speak for ws_idle_timeout_s: an idle_timeout error, then close
    1000, and nothing after it (the session ends one way: it no longer speaks the unfinished
    text and then sends session.done as well)."""
    async def run():
        async with websockets.connect(_ws_url(live)) as ws:
            await ws.send(json.dumps(CONFIG))
            await ws.send(json.dumps({"type": "input.text", "text": "Unfinished"}))
            started = time.perf_counter()
            events, _, _ = await _receive_all(ws)
            return events, time.perf_counter() - started, ws.close_code

    events, waited, close_code = asyncio.run(run())
    assert [e["type"] for e in events] == ["error"] and events[0]["code"] == "idle_timeout"
    assert "10 characters of unfinished text were not spoken" in events[0]["message"]
    assert close_code == 1000
    assert IDLE_S <= waited < IDLE_S + 10


def test_auth_and_admission_gate(tiny_model_dir, tmp_path):
    settings = ServerSettings(served_model_name="t", api_key="sekret", voices_dir=tmp_path,
                              max_queue=0, segment_max_chars=40)
    server = start_live_engine_server(tiny_model_dir, settings, max_num_seqs=1)

    async def session(url, headers=None):
        async with websockets.connect(url, additional_headers=headers) as ws:
            try:
                await ws.send(json.dumps(CONFIG))
                await ws.send(json.dumps({"type": "input.text", "text": "Hello."}))
                await ws.send(json.dumps({"type": "session.close"}))
            except websockets.ConnectionClosed:
                pass  # refused: the server closed before we were done sending
            return (await _receive_all(ws))[0], ws.close_code

    async def run():
        url = _ws_url(server)
        events, code = await session(url)
        assert events[0]["code"] == "invalid_api_key" and code == 1008
        events, code = await session(url + "?api_key=wrong")
        assert events[0]["code"] == "invalid_api_key" and code == 1008
        events, _ = await session(url, {"Authorization": "Bearer sekret"})
        assert events[-1]["type"] == "session.done" and events[-1]["total_sentences"] == 1
        events, _ = await session(url + "?api_key=sekret")
        assert events[-1]["total_sentences"] == 1
        # one slot in all (1 running + 0 queued): a second session's config is refused before it
        # is planned (planning may fetch and encode a reference, as a REST request's would), so
        # its text finds no configured session; a sentence of a session configured earlier is refused
        async with websockets.connect(url + "?api_key=sekret") as early:
            await early.send(json.dumps(CONFIG))  # configured while the slot is free
            async with websockets.connect(url + "?api_key=sekret") as busy:
                await busy.send(json.dumps({**CONFIG, "max_new_tokens": 200}))
                await busy.send(json.dumps({"type": "input.text", "text": "Long. And more"}))
                while not isinstance(await busy.recv(), bytes):
                    pass
                events, _ = await session(url + "?api_key=sekret")
                await early.send(json.dumps({"type": "input.text", "text": "Hello."}))
                await early.send(json.dumps({"type": "session.close"}))
                early_events = (await _receive_all(early))[0]
        assert [e.get("code") for e in events if e["type"] == "error"] == ["queue_full", "not_configured"]
        assert "send session.config again later" in events[0]["message"]
        assert events[-1]["type"] == "session.done" and events[-1]["total_sentences"] == 0
        assert [e.get("code") for e in early_events if e["type"] == "error"] == ["queue_full"]
        assert early_events[-1]["type"] == "session.done" and early_events[-1]["total_sentences"] == 0
        gate, deadline = server.app.state.server.gate, time.monotonic() + 5
        while gate.in_flight:  # the busy session's sentence is aborted as its socket closes
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)

    try:
        asyncio.run(run())
    finally:
        server.stop()


@pytest.mark.parametrize("fmt", ["mp3", "opus", "flac", "ulaw"])
def test_each_sentence_is_one_file_of_the_session_format(live, fmt):
    """Every format streams on the WebSocket too: each sentence's binary messages, joined, are one
    file of the format that decodes whole (FFmpeg's libraries, PyAV), as long as the sentence's audio."""
    from support.decoders import CODEC_FRAME, STREAM_DELAY, av_decode

    async def run() -> list[bytes]:
        sentences: list[bytes] = []
        async with websockets.connect(_ws_url(live)) as ws:
            await ws.send(json.dumps({**CONFIG, "response_format": fmt, "max_new_tokens": 30}))
            await ws.send(json.dumps({"type": "input.text", "text": "First one. Second one."}))
            await ws.send(json.dumps({"type": "session.close"}))
            async for message in ws:
                if isinstance(message, bytes):
                    sentences[-1] += message
                    continue
                event = json.loads(message)
                if event["type"] == "audio.start":
                    assert event["format"] == fmt
                    sentences.append(b"")
                elif event["type"] == "audio.done":
                    assert event["total_bytes"] == len(sentences[-1])
                elif event["type"] == "session.done":
                    break
        return sentences

    sentences = asyncio.run(run())
    rate = 8000 if fmt == "ulaw" else 24000
    assert len(sentences) == 2
    for data in sentences:
        extra = av_decode(data, fmt, rate).size - 30 * rate // 25 - STREAM_DELAY.get(fmt, 0)
        assert 0 <= extra < (CODEC_FRAME[fmt](rate) if fmt in CODEC_FRAME else 1), (fmt, extra)
