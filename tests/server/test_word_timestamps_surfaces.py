"""`word_timestamps: true` on every surface (issue 42, point 2), against the real engine (tiny
checkpoint) behind real uvicorn: the official `openai` client for REST, httpx for SSE, a real
`websockets` client for vllm-omni's WebSocket sequence.

The tiny model's audio is noise, so the aligner's times say nothing about speech: these tests
assert the contract (one entry per whitespace word of the input, tags removed, in order, inside
the audio, on the response's one timeline across segments); accuracy is
benchmarks/last_mile/bench_alignment.py's.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time

import httpx
import openai
import pytest
import soundfile as sf
import websockets
from live_engine import start_live_engine_server

from higgs_serve.alignment import user_words
from higgs_serve.server.settings import ServerSettings

NAME = "higgs-tiny"
FRAMES = 30  # 1.2 s per request or sentence: room for a few words (else they would be null)
SENTENCE = "Hello world, here we are."
TWO = "Hello world. How are you?"
# three segments at segment_max_chars 40 (each spoken with FRAMES frames)
LONG = "The first sentence is here. <|emotion:happy|>The second one is here. And a third to end."


@pytest.fixture(scope="module")
def live(tiny_model_dir, tmp_path_factory):
    settings = ServerSettings(served_model_name=NAME, segment_max_chars=40,
                              voices_dir=tmp_path_factory.mktemp("voices"), max_queue=2,
                              max_input_chars=2000, ws_idle_timeout_s=20, alignment_workers=1)
    server = start_live_engine_server(tiny_model_dir, settings)
    # the aligner's model loads once here, not inside a test's timing
    server.app.state.server.aligner_pool.start("pocketsphinx-en").result(timeout=120)
    yield server
    server.stop()


def _body(text: str = SENTENCE, **extra) -> dict:
    return {"model": NAME, "input": text, "voice": "default", "word_timestamps": True,
            "max_new_tokens": FRAMES, "min_new_tokens": FRAMES, "seed": 5, **extra}


def _check_words(words: list[dict], text: str, duration_ms: float) -> None:
    """The contract: the input's words, in order, non-overlapping, inside the audio."""
    assert [w["word"] for w in words] == user_words(text)
    previous_end = 0
    for word in words:
        assert previous_end <= word["start_ms"] <= word["end_ms"] <= duration_ms + 1, words
        previous_end = word["end_ms"]


def _wav_ms(data: bytes) -> float:
    audio, rate = sf.read(io.BytesIO(data), dtype="float32")
    return 1e3 * len(audio) / rate


# ---------------------------------------------------------------------------------- REST
def test_file_carries_the_words_in_vllm_omnis_header(live):
    """stream: false through the official client: X-Word-Timestamps, compact ASCII JSON."""
    client = openai.OpenAI(base_url=live.url + "/v1", api_key="none")
    response = client.audio.speech.with_raw_response.create(
        model=NAME, voice="default", input=SENTENCE, response_format="wav",
        extra_body={k: v for k, v in _body(stream=False).items()
                    if k not in ("model", "voice", "input")})
    words = json.loads(response.headers["x-word-timestamps"])
    _check_words(words, SENTENCE, _wav_ms(response.content))
    assert "x-audio-buffered" not in response.headers  # stream: false asked for a file anyway


def test_a_raw_stream_asking_for_words_is_sent_whole_and_says_so(live):
    """The header precedes the body, so the raw stream waits for the whole audio: it comes as a
    file (Content-Length) with X-Audio-Buffered naming the reason; speed 2 halves the times."""
    response = httpx.post(live.url + "/v1/audio/speech", json=_body(speed=2.0, stream=True), timeout=60)
    assert response.status_code == 200, response.text
    assert response.headers["x-audio-buffered"] == "word_timestamps"
    assert int(response.headers["content-length"]) == len(response.content)
    duration_ms = _wav_ms(response.content)
    assert duration_ms == pytest.approx(FRAMES * 40 / 2, abs=45)  # stretched to half
    _check_words(json.loads(response.headers["x-word-timestamps"]), SENTENCE, duration_ms)


def test_sse_sends_a_words_event_after_the_audio(live):
    events = _sse(live, _body(stream_format="sse", response_format="pcm"))
    kinds = [e["type"] for e in events]
    assert kinds[-2:] == ["speech.words", "speech.audio.done"] and "speech.audio.delta" in kinds
    assert kinds.index("speech.words") > max(i for i, k in enumerate(kinds) if k == "speech.audio.delta")
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    duration_ms = 1e3 * len(pcm) / 2 / 24000
    words_event = events[-2]
    assert (words_event["index"], words_event["start_ms"]) == (0, 0)
    assert words_event["end_ms"] == pytest.approx(duration_ms, abs=1)
    _check_words(words_event["words"], SENTENCE, duration_ms)


def test_long_form_words_share_the_recordings_timeline(live):
    """A file in three segments: every word once, in order, each inside its segment
    (X-Segments), so the timeline runs on across segments; SSE: one speech.words per segment,
    its span the segment's."""
    response = httpx.post(live.url + "/v1/audio/speech", json=_body(LONG, stream=False), timeout=120)
    assert response.status_code == 200, response.text
    words = json.loads(response.headers["x-word-timestamps"])
    _check_words(words, LONG, _wav_ms(response.content))
    segments = json.loads(response.headers["x-segments"])
    assert len(segments) == 3
    for char_start, char_end, start_s, end_s in segments:
        count = len(user_words(LONG[char_start:char_end]))
        mine, words = words[:count], words[count:]
        assert all(1e3 * start_s - 1 <= w["start_ms"] <= w["end_ms"] <= 1e3 * end_s + 1 for w in mine)
    assert words == []

    events = _sse(live, _body(LONG, stream_format="sse", response_format="pcm"))
    spans = {e["index"]: (e["start_s"], e["end_s"]) for e in events if e["type"] == "speech.segment.done"}
    timed = [e for e in events if e["type"] == "speech.words"]
    assert [e["index"] for e in timed] == [0, 1, 2]
    for event in timed:
        start_s, end_s = spans[event["index"]]
        assert (event["start_ms"], event["end_ms"]) == (round(1e3 * start_s), round(1e3 * end_s))
    all_words = [w for e in timed for w in e["words"]]
    _check_words(all_words, LONG, 1e3 * spans[2][1])
    assert events[-1]["type"] == "speech.audio.done"


@pytest.mark.parametrize("extra, param", [
    ({"language": "German"}, "language"),  # no aligner reads German
    ({"input": "你好，世界。"}, "language"),  # 'auto' with text that is not English
    ({"initial_codec_chunk_frames": 4, "stream": True}, "initial_codec_chunk_frames"),  # the raw stream waits
])
def test_requests_the_aligner_cannot_serve_are_400s(live, extra, param):
    response = httpx.post(live.url + "/v1/audio/speech", json={**_body(), **extra}, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_batch_refuses_word_timestamps(live):
    response = httpx.post(live.url + "/v1/audio/speech/batch", timeout=30, json={
        "model": NAME, "items": [{"input": "One."}, {"input": "Two.", "word_timestamps": True}]})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "word_timestamps"


def _sse(live, body: dict) -> list[dict]:
    response = httpx.post(live.url + "/v1/audio/speech", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return [json.loads(line[len("data: "):]) for line in response.text.splitlines()
            if line.startswith("data: ")]


# ----------------------------------------------------------------------------- WebSocket
def _ws_url(live) -> str:
    return live.url.replace("http://", "ws://") + "/v1/audio/speech/stream"


async def _until(ws, kind: str) -> list[dict]:
    events = []
    while True:
        message = await asyncio.wait_for(ws.recv(), timeout=60)
        assert not isinstance(message, bytes), "word_timestamps sends JSON frames only"
        events.append({**json.loads(message), "t": time.perf_counter()})
        if events[-1]["type"] == kind:
            return events


def test_vllm_omni_e2e_sequence_with_word_timestamps(live):
    """vllm-omni's e2e client with word_timestamps: session.config -> input.text -> input.done,
    read until session.done: no error event at all, session.done within 1 s of the last audio;
    per sentence audio.start (word_timestamps true), audio.chunk frames (audio_b64, timestamps
    null), a trailing audio.chunk with no audio and the sentence's words, then audio.done."""
    async def run():
        async with websockets.connect(_ws_url(live)) as ws:
            await ws.send(json.dumps({"type": "session.config", "model": NAME, "voice": "default",
                                      "response_format": "pcm", "stream_audio": True,
                                      "word_timestamps": True, "max_new_tokens": FRAMES,
                                      "min_new_tokens": FRAMES, "seed": 3}))
            await ws.send(json.dumps({"type": "input.text", "text": TWO}))
            await ws.send(json.dumps({"type": "input.done"}))
            return await _until(ws, "session.done")

    events = asyncio.run(run())
    assert [e for e in events if e["type"] == "error"] == []
    audio = [e for e in events if e["type"] == "audio.chunk" and e["audio_b64"]]
    assert events[-1]["type"] == "session.done" and events[-1]["t"] - audio[-1]["t"] < 1.0
    assert (events[-1]["utterance_index"], events[-1]["total_sentences"]) == (0, 2)
    sentences = [[]]
    for event in events[:-1]:
        sentences[-1].append(event)
        if event["type"] == "audio.done":
            sentences.append([])
    assert sentences.pop() == []
    for index, (sentence, text) in enumerate(zip(sentences, ["Hello world.", "How are you?"])):
        start, *chunks, trailing, done = sentence
        assert (start["type"], start["sentence_index"], start["sentence_text"]) == ("audio.start", index, text)
        assert start["word_timestamps"] is True
        assert [c["chunk_id"] for c in chunks + [trailing]] == list(range(len(chunks) + 1))
        ends = [c["chunk_end_ms"] for c in chunks]
        assert all(c["audio_b64"] and c["timestamps"] is None and c["sample_rate"] == 24000
                   and c["utterance_index"] == 0 and c["sentence_index"] == index for c in chunks)
        assert [c["chunk_start_ms"] for c in chunks] == [0] + ends[:-1] and ends == sorted(ends)
        pcm = b"".join(base64.b64decode(c["audio_b64"]) for c in chunks)
        duration_ms = 1e3 * len(pcm) / 2 / 24000
        assert ends[-1] == pytest.approx(duration_ms, abs=1)
        assert (trailing["audio_b64"], trailing["chunk_start_ms"], trailing["chunk_end_ms"]) == ("", 0, ends[-1])
        _check_words(trailing["timestamps"], text, duration_ms)  # sentence-relative
        assert (done["type"], done["sentence_index"], done["total_bytes"]) == ("audio.done", index, len(pcm))


@pytest.mark.parametrize("config, param", [
    ({"session": {"word_timestamps": True}}, "word_timestamps"),  # sglang-omni has none
    ({"word_timestamps": True, "language": "de"}, "language"),
    ({"word_timestamps": True, "audio_transport": "binary"}, "audio_transport"),
])
def test_session_configs_that_cannot_have_timestamps_get_an_error_event(live, config, param):
    async def run():
        async with websockets.connect(_ws_url(live)) as ws:
            await ws.send(json.dumps({"type": "session.config", **config}))
            return json.loads(await asyncio.wait_for(ws.recv(), timeout=30))

    event = asyncio.run(run())
    assert event["type"] == "error" and event["error"]["param"] == param, event
    assert param in event["message"] or param == "language"


def test_metrics_count_alignments(live):
    """After the requests above (or this one alone): the alignment histogram has observations."""
    httpx.post(live.url + "/v1/audio/speech", json=_body(stream=False), timeout=60).raise_for_status()
    text = httpx.get(live.url + "/metrics", timeout=10).text
    count = next(float(line.split()[-1]) for line in text.splitlines()
                 if line.startswith("higgs_serve_alignment_seconds_count"))
    assert count >= 1 and "higgs_serve_alignment_failures_total" in text


def test_a_server_without_aligner_processes_refuses_the_field(tmp_path):
    """--alignment-workers 0: word_timestamps is a 400 naming the field, on REST and in a
    WebSocket session.config; nothing else changes."""
    from fake_engine import FakeEngine
    from live_server import MODEL_NAME, fake_settings, start_threaded_server

    server = start_threaded_server(FakeEngine(), fake_settings(tmp_path, alignment_workers=0))
    try:
        assert server.app.state.server.aligner_pool is None
        response = httpx.post(server.url + "/v1/audio/speech", timeout=30, json={
            "model": MODEL_NAME, "input": "Hello there.", "word_timestamps": True})
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "word_timestamps"
        assert "--alignment-workers 0" in response.json()["error"]["message"]

        async def session():
            async with websockets.connect(_ws_url(server)) as ws:
                await ws.send(json.dumps({"type": "session.config", "word_timestamps": True}))
                return json.loads(await asyncio.wait_for(ws.recv(), timeout=10))

        assert asyncio.run(session())["error"]["param"] == "word_timestamps"
    finally:
        server.stop()
