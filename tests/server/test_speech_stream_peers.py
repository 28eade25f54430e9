"""WS /v1/audio/speech/stream speaks both peers' protocols to the letter (issue 42, point 1),
against the real engine (tiny checkpoint) behind real uvicorn, with a real `websockets` client.

Each test replays one peer's exact client message sequence and asserts that no `error` event
arrives at all:
  - vllm-omni (serving_speech_stream.py and its tests): session.config with the fields at the top
    level; input.text; input.done ends the utterance: what is buffered is spoken, then
    `session.done {utterance_index, total_sentences}`, and the connection stays open for the next
    utterance; its e2e client reads until session.done and closes.
  - sglang-omni (speech_ws.py): `{"type": "session.config", "session": {...}}`, answered with
    `session.configured`; input.text; input.done speaks the rest, sends session.done and ends
    the session.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import websockets
from live_engine import start_live_engine_server
from server_log import faults, server_log

from higgs_serve.server.settings import ServerSettings

FRAMES = 6
NAME = "higgs-tiny"


@pytest.fixture(scope="module")
def live(tiny_model_dir, tmp_path_factory):
    settings = ServerSettings(served_model_name=NAME, segment_max_chars=60,
                              voices_dir=tmp_path_factory.mktemp("voices"), max_queue=2,
                              max_input_chars=2000, ws_idle_timeout_s=20)
    server = start_live_engine_server(tiny_model_dir, settings)
    yield server
    server.stop()


def _url(live) -> str:
    return live.url.replace("http://", "ws://") + "/v1/audio/speech/stream"


async def _until(ws, kind: str) -> list[dict]:
    """Messages up to and including the first JSON event of type `kind` (binary frames as
    {"type": "<binary>"}), each with its arrival time `t`."""
    events = []
    while True:
        message = await asyncio.wait_for(ws.recv(), timeout=30)
        now = time.perf_counter()
        if isinstance(message, bytes):
            events.append({"type": "<binary>", "bytes": len(message), "t": now})
            continue
        events.append({**json.loads(message), "t": now})
        if events[-1]["type"] == kind:
            return events


def _no_errors(events: list[dict]) -> None:
    assert [e for e in events if e["type"] == "error"] == []


def _done_soon_after_audio(events: list[dict]) -> None:
    """session.done within 1 s of the utterance's last audio (issue 42's acceptance)."""
    last_audio = max(e["t"] for e in events if e["type"] == "<binary>")
    assert events[-1]["type"] == "session.done" and events[-1]["t"] - last_audio < 1.0


def test_vllm_omni_e2e_sequence_ends_the_utterance_with_session_done(live):
    """vllm-omni's e2e client: config, one text, input.done, read until session.done, close.
    Before: no session.done came; 30 s later an idle_timeout error did (issue 42)."""
    async def run():
        async with websockets.connect(_url(live)) as ws:
            await ws.send(json.dumps({"type": "session.config", "model": NAME, "voice": "default",
                                      "response_format": "pcm", "stream_audio": True,
                                      "max_new_tokens": FRAMES, "seed": 3}))
            await ws.send(json.dumps({"type": "input.text", "text": "Hello world. "}))
            await ws.send(json.dumps({"type": "input.done"}))
            return await _until(ws, "session.done")

    with server_log() as log:
        events = asyncio.run(run())
        time.sleep(0.2)  # the server's side of the close
    _no_errors(events)
    _done_soon_after_audio(events)
    kinds = [e["type"] for e in events if e["type"] != "<binary>"]
    assert kinds == ["audio.start", "audio.done", "session.done"]
    start, done, session_done = [e for e in events if e["type"] != "<binary>"]
    assert (start["utterance_index"], start["sentence_index"], start["sentence_text"]) == (0, 0, "Hello world.")
    assert (done["utterance_index"], done["sentence_index"], done["error"]) == (0, 0, False)
    assert done["total_bytes"] == sum(e["bytes"] for e in events if e["type"] == "<binary>")
    assert (session_done["utterance_index"], session_done["total_sentences"]) == (0, 1)
    assert faults(log) == []  # the client closing right after session.done is normal


def test_vllm_omni_utterances_share_one_connection_and_session_close_ends_it(live):
    """input.done is a flush that ends an utterance, not the connection: a second utterance
    follows on the same socket (its sentence_index starts again at 0), config stays sticky; the
    default vllm-omni config (wav, one binary message per sentence) is honoured; session.close
    then ends with session.done and close 1000."""
    async def run():
        async with websockets.connect(_url(live)) as ws:
            await ws.send(json.dumps({"type": "session.config", "voice": "default",
                                      "stream_audio": False, "max_new_tokens": FRAMES}))
            await ws.send(json.dumps({"type": "input.text", "text": "First turn. Two"}))
            await ws.send(json.dumps({"type": "input.done"}))
            first = await _until(ws, "session.done")
            await ws.send(json.dumps({"type": "input.text", "text": "Second turn."}))
            await ws.send(json.dumps({"type": "input.done"}))
            second = await _until(ws, "session.done")
            await ws.send(json.dumps({"type": "session.close"}))
            last = await _until(ws, "session.done")
            with pytest.raises(websockets.ConnectionClosedOK):
                await asyncio.wait_for(ws.recv(), timeout=5)
            return first, second, last, ws.close_code

    first, second, last, close_code = asyncio.run(run())
    for events in (first, second, last):
        _no_errors(events)
    starts = [e for e in first if e["type"] == "audio.start"]
    assert [(e["sentence_index"], e["sentence_text"]) for e in starts] == [(0, "First turn."), (1, "Two")]
    assert [e["bytes"] > 44 for e in first if e["type"] == "<binary>"] == [True, True]
    audio = [e for e in first if e["type"] == "<binary>"]
    assert len(audio) == 2  # stream_audio false: one message per sentence (a whole WAV)
    assert first[-1]["total_sentences"] == 2 and first[-1]["utterance_index"] == 0
    assert [e["sentence_index"] for e in second if e["type"] == "audio.start"] == [0]
    assert (second[-1]["utterance_index"], second[-1]["total_sentences"]) == (1, 1)
    assert (last[-1]["utterance_index"], last[-1]["total_sentences"]) == (2, 0)
    assert close_code == 1000


def test_input_flush_speaks_the_buffer_and_keeps_the_utterance_open(live):
    async def run():
        async with websockets.connect(_url(live)) as ws:
            await ws.send(json.dumps({"type": "session.config", "response_format": "pcm",
                                      "max_new_tokens": FRAMES}))
            await ws.send(json.dumps({"type": "input.text", "text": "No period here"}))
            await ws.send(json.dumps({"type": "input.flush"}))
            flushed = await _until(ws, "audio.done")
            await ws.send(json.dumps({"type": "input.text", "text": "Then more."}))
            await ws.send(json.dumps({"type": "input.done"}))
            return flushed, await _until(ws, "session.done")

    flushed, rest = asyncio.run(run())
    _no_errors(flushed + rest)
    assert [e["sentence_text"] for e in flushed if e["type"] == "audio.start"] == ["No period here"]
    assert rest[-1]["total_sentences"] == 2 and rest[-1]["utterance_index"] == 0


def test_sglang_omni_sequence_ends_the_session_after_input_done(live):
    """sglang-omni's client: the config nested under `session` (which selects its protocol),
    session.configured first, then per sentence audio.start {id, sentence_index, sentence_text,
    format, sample_rate} / binary pcm / audio.done {id, sentence_index, total_bytes, error},
    then session.done {total_sentences} and the close."""
    async def run():
        async with websockets.connect(_url(live)) as ws:
            await ws.send(json.dumps({"type": "session.config", "session": {
                "response_format": "pcm", "stream_audio": True, "split_granularity": "sentence",
                "max_new_tokens": FRAMES}}))
            await ws.send(json.dumps({"type": "input.text", "text": "Hello world. How are you?"}))
            await ws.send(json.dumps({"type": "input.done"}))
            events = await _until(ws, "session.done")
            with pytest.raises(websockets.ConnectionClosedOK):
                await asyncio.wait_for(ws.recv(), timeout=5)
            return events, ws.close_code

    events, close_code = asyncio.run(run())
    _no_errors(events)
    _done_soon_after_audio(events)
    configured = events[0]
    assert configured["type"] == "session.configured"
    assert (configured["response_format"], configured["stream_audio"], configured["sample_rate"],
            configured["split_granularity"]) == ("pcm", True, 24000, "sentence")
    assert configured["session_id"]
    starts = [e for e in events if e["type"] == "audio.start"]
    dones = [e for e in events if e["type"] == "audio.done"]
    assert [(e["sentence_index"], e["sentence_text"]) for e in starts] == [
        (0, "Hello world."), (1, "How are you?")]
    assert [s["id"] for s in starts] == [d["id"] for d in dones] and len(set(s["id"] for s in starts)) == 2
    assert all(e["sample_rate"] == 24000 and e["format"] == "pcm" for e in starts)
    assert [d["error"] for d in dones] == [False, False]
    assert events[-1]["total_sentences"] == 2 and close_code == 1000


@pytest.mark.parametrize("message, param", [
    ({"type": "session.config", "session": "pcm"}, "session"),
    ({"type": "session.config", "session": {}, "voice": "default"}, "voice"),
    ({"type": "session.config", "split_granularity": "clause"}, "split_granularity"),
])
def test_config_shape_errors_name_the_field(live, message, param):
    async def run():
        async with websockets.connect(_url(live)) as ws:
            await ws.send(json.dumps(message))
            await ws.send(json.dumps({"type": "session.close"}))
            return await _until(ws, "session.done")

    events = asyncio.run(run())
    errors = [e for e in events if e["type"] == "error"]
    assert [e["error"]["param"] for e in errors] == [param]
