"""HTTP-layer tests against a live uvicorn server (loopback, background thread) with the FAKE
engine from fake_engine.py: formats, streaming, SSE, validation, voices, overload, disconnect.
The same paths are exercised with the real engine in test_real_server.py."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import threading
import time

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from bad_requests import bad_requests, post_bad_request
from fake_engine import FakeEngine, fake_audio, fake_deploy
from fuzz import clamp_frame_fields, fuzz_server
from live_server import MODEL_NAME, fake_settings, start_threaded_server
from support.decoders import CODEC_FRAME, FILE_DELAY, STREAM_DELAY, av_decode

from higgs_serve.audio.formats import FORMATS, float_to_pcm16
from higgs_serve.server.app import build_app

RATE = 24000
TEXT = "Hello there."  # 12 characters -> 24 frames with the fake engine
FRAMES = 24


@pytest.fixture(scope="module")
def http(fake_server):
    with httpx.Client(base_url=fake_server.url, timeout=10) as client:
        yield client


@pytest.fixture(scope="module")
def oai(fake_server):
    return openai.OpenAI(base_url=f"{fake_server.url}/v1", api_key="unused", max_retries=0)


def parse_sse(text: str) -> list[dict]:
    events = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        payload = json.loads(lines["data"])
        assert payload["type"] == lines["event"]
        events.append(payload)
    return events


def expected_pcm(seed: int, frames: int = FRAMES) -> bytes:
    return float_to_pcm16(fake_audio(seed, 0, frames))


# ----------------------------------------------------------------------------- good requests
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_the_streaming_rule_in_every_format(oai, fmt):
    """docs/api.md#streaming: `stream: true` streams every format (chunked, no Content-Length);
    `stream: false` is the same audio as one file with its Content-Length; the SDK's default
    create (neither) is the stream, except in wav and flac, whose header states the length: the
    file."""
    rate = FORMATS[fmt].default_rate_hz or RATE

    def create(**fields):
        return oai.audio.speech.with_raw_response.create(
            model=MODEL_NAME, input=TEXT, voice="default", response_format=fmt,
            extra_body={"seed": 7, **fields})

    streamed = create(stream=True)
    assert "content-length" not in streamed.headers and streamed.headers["x-sample-rate"] == str(rate)
    response = create(stream=False)
    assert int(response.headers["content-length"]) == len(response.content)
    default = create()
    assert default.content == (response if fmt in ("wav", "flac") else streamed).content
    samples = FRAMES * 960 * rate // RATE
    for data, delay in ((streamed.content, STREAM_DELAY), (response.content, FILE_DELAY)):
        decoded = av_decode(data, fmt, rate)
        extra = decoded.size - samples - delay.get(fmt, 0)
        assert 0 <= extra <= (CODEC_FRAME[fmt](rate) if fmt in CODEC_FRAME else 0), (fmt, extra)
    if fmt in ("wav", "flac", "mp3", "opus"):  # what soundfile (libsndfile) reads
        audio, file_rate = sf.read(io.BytesIO(response.content), dtype="float32", always_2d=True)
        assert file_rate == rate and audio.shape == (samples, 1)


def test_pcm_file_matches_the_engine_audio_and_reports_usage(http):
    response = http.post("/v1/audio/speech", json={
        "model": MODEL_NAME, "input": TEXT, "response_format": "pcm", "seed": 7, "stream": False})
    assert response.status_code == 200
    assert response.headers["content-type"] == "audio/pcm"
    assert response.headers["x-sample-rate"] == "24000"
    assert response.content == expected_pcm(7)
    assert response.headers["x-usage-output-tokens"] == str(FRAMES)
    assert response.headers["x-usage-input-tokens"] == "2"  # the fake counts words
    assert response.headers["x-finish-reason"] == "stop"


@pytest.mark.parametrize("fmt", ["pcm", "wav"])
def test_raw_streaming_with_the_openai_client(oai, fmt):
    with oai.audio.speech.with_streaming_response.create(
            model=MODEL_NAME, input=TEXT, voice="default", response_format=fmt,
            stream_format="audio", extra_body={"seed": 7}) as response:
        assert response.headers["x-sample-rate"] == "24000"
        pieces = list(response.iter_bytes())
    body = b"".join(pieces)
    if fmt == "wav":
        audio, rate = sf.read(io.BytesIO(body), dtype="int16")
        assert rate == RATE
        body = audio.astype("<i2").tobytes()
    assert body == expected_pcm(7)


def test_streams_report_the_server_time_to_first_audio(fake_server, http):
    engine = fake_server.engine
    engine.step_delay_s = 0.05  # the fake's first chunk comes one step after the request
    try:
        for fmt in ("audio", "sse"):
            t0 = time.perf_counter()
            with http.stream("POST", "/v1/audio/speech", json={
                    "input": TEXT, "response_format": "pcm", "stream_format": fmt}) as response:
                client_ms = 1e3 * (time.perf_counter() - t0)  # headers leave with the first audio
                server_ms = float(response.headers["x-time-to-first-audio-ms"])
                response.read()
            assert 45 <= server_ms <= client_ms
    finally:
        engine.step_delay_s = 0.0


def test_sse_deltas_equal_the_non_streamed_audio(oai, http):
    with oai.audio.speech.with_streaming_response.create(
            model=MODEL_NAME, input=TEXT, voice="default", response_format="pcm",
            stream_format="sse", extra_body={"seed": 11}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = parse_sse(response.read().decode())
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
    assert len(events) > 2  # really streamed in several chunks
    streamed = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    file = http.post("/v1/audio/speech", json={"input": TEXT, "response_format": "pcm",
                                               "seed": 11}).content
    assert streamed == file
    done = events[-1]
    assert done["type"] == "speech.audio.done" and done["finish_reason"] == "stop"
    assert done["usage"] == {"input_tokens": 2, "output_tokens": FRAMES, "total_tokens": 2 + FRAMES}


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "alaw"])
def test_sse_carries_the_formats_bytes(http, fmt):
    """SSE deltas are base64 of the raw stream's bytes, in order: joined, they are the same file
    (LiveKit reads mp3 this way)."""
    body = {"input": TEXT, "response_format": fmt, "seed": 12}
    raw = http.post("/v1/audio/speech", json=body).content
    events = parse_sse(http.post("/v1/audio/speech",
                                 json={**body, "stream_format": "sse"}).text)
    deltas = [base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) > 1 and b"".join(deltas) == raw
    assert events[-1]["type"] == "speech.audio.done"
    rate = FORMATS[fmt].default_rate_hz or RATE
    assert av_decode(raw, fmt, rate).size >= FRAMES * 960 * rate // RATE


def test_sampling_fields_reach_the_engine_and_seed_repeats(fake_server, http):
    body = {"input": TEXT, "response_format": "pcm", "seed": 5, "temperature": 0.5,
            "top_p": 0.9, "top_k": 12, "max_new_tokens": 10, "min_new_tokens": 9, "stream": False}
    first = http.post("/v1/audio/speech", json=body)
    second = http.post("/v1/audio/speech", json=body)
    assert first.status_code == 200 and first.content == second.content
    assert first.headers["x-finish-reason"] == "length"
    assert len(first.content) == 10 * 960 * 2
    sampling = fake_server.engine.requests[-1].sampling
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.seed,
            sampling.max_new_tokens, sampling.min_new_tokens) == (0.5, 0.9, 12, 5, 10, 9)
    other = http.post("/v1/audio/speech", json={**body, "seed": 6})
    assert other.content != first.content


def test_speed_stretches_non_streamed_audio(http):
    normal = http.post("/v1/audio/speech", json={"input": TEXT, "response_format": "pcm",
                                                 "seed": 1})
    fast = http.post("/v1/audio/speech", json={"input": TEXT, "response_format": "pcm",
                                               "seed": 1, "speed": 2.0})
    assert fast.status_code == 200
    assert len(fast.content) == len(normal.content) // 2


def test_models_health_ready(http):
    models = http.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == MODEL_NAME
    assert http.get("/health").status_code == 200
    assert http.get("/ready").json() == {"status": "ready"}


# ----------------------------------------------------------------------------- bad requests
BAD_REQUESTS = bad_requests(max_input_chars=200, max_tokens=200)


@pytest.mark.parametrize("case, body, status, param", BAD_REQUESTS,
                         ids=[case[0] for case in BAD_REQUESTS])
def test_bad_request_gets_an_openai_error(http, case, body, status, param):
    post_bad_request(http, body, status, param)


def test_valid_clip_without_cloning_says_cloning_is_off_and_engine_survives(http):
    buffer = io.BytesIO()
    sf.write(buffer, np.zeros(24000, np.float32), RATE, format="WAV")
    clip = "data:audio/wav;base64," + base64.b64encode(buffer.getvalue()).decode()
    response = http.post("/v1/audio/speech", json={"input": "hi", "ref_audio": clip})
    assert response.status_code == 400
    assert "cloning is not enabled" in response.json()["error"]["message"]
    ok = http.post("/v1/audio/speech", json={"input": TEXT, "response_format": "pcm", "seed": 7})
    assert ok.status_code == 200 and ok.content == expected_pcm(7)
    metrics = http.get("/metrics").text
    assert 'higgs_serve_requests_total{outcome="invalid"}' in metrics


# ----------------------------------------------------------------------------- voices
def _wav(seconds: float) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, 0.1 * np.ones(int(seconds * RATE), np.float32), RATE, format="WAV")
    return buffer.getvalue()


def test_voice_registry_endpoints(http, fake_server):
    files = {"audio_sample": ("v.wav", _wav(1.0), "audio/wav")}
    created = http.post("/v1/audio/voices", data={"name": "narrator", "ref_text": "Hi."},
                        files=files)
    assert created.status_code == 200, created.text
    assert created.json()["name"] == "narrator" and created.json()["duration_s"] == 1.0
    duplicate = http.post("/v1/audio/voices", data={"name": "narrator"}, files=files)
    assert duplicate.status_code == 409
    extra = http.post("/v1/audio/voices", data={"name": "x1", "mood": "yes"}, files=files)
    assert extra.status_code == 400 and extra.json()["error"]["param"] == "mood"
    bad = http.post("/v1/audio/voices", data={"name": "x2"},
                    files={"audio_sample": ("v.wav", b"garbage", "audio/wav")})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "audio_sample"
    missing = http.post("/v1/audio/voices", data={"name": "x3"})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "audio_sample"
    listed = http.get("/v1/audio/voices").json()
    assert [v["name"] for v in listed["data"]] == ["narrator"]
    assert (fake_server.app.state.server.settings.voices_dir / "narrator" / "audio.wav").exists()
    use = http.post("/v1/audio/speech", json={"input": "hi", "voice": "narrator"})
    assert use.status_code == 400 and "cloning is not enabled" in use.json()["error"]["message"]
    assert http.delete("/v1/audio/voices/narrator").json() == {
        "object": "voice.deleted", "name": "narrator", "deleted": True}
    assert http.delete("/v1/audio/voices/narrator").status_code == 404
    assert http.get("/v1/audio/voices").json()["data"] == []


def test_voice_upload_over_10_mb_is_413(http):
    files = {"audio_sample": ("big.wav", b"\0" * (10 * 1024 * 1024 + 1), "audio/wav")}
    response = http.post("/v1/audio/voices", data={"name": "big"}, files=files)
    assert response.status_code == 413 and response.json()["error"]["param"] == "audio_sample"


# ----------------------------------------------------------------------------- load and abort
def _gauge(http: httpx.Client, name: str) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"metric {name} not exported")


def test_overload_is_an_immediate_429_then_recovers(fake_server, http):
    engine = fake_server.engine
    engine.hold.clear()  # "HOLD" requests wait before their first chunk
    results: list[int] = []
    workers = [threading.Thread(target=lambda: results.append(http.post(
        "/v1/audio/speech", json={"input": "HOLD please", "response_format": "pcm"},
        timeout=10).status_code)) for _ in range(3)]  # capacity: 2 slots + 1 queued
    try:
        for worker in workers:
            worker.start()
        deadline = time.monotonic() + 5
        while _gauge(http, "higgs_serve_server_in_flight_requests") < 3:
            assert time.monotonic() < deadline, "the held requests were never admitted"
            time.sleep(0.01)
        started = time.perf_counter()
        rejected = http.post("/v1/audio/speech", json={"input": "hi"})
        assert time.perf_counter() - started < 0.5
        assert rejected.status_code == 429
        assert rejected.headers["retry-after"] == "1"
        assert rejected.json()["error"]["code"] == "queue_full"
    finally:
        engine.hold.set()
        for worker in workers:
            worker.join(timeout=10)
    assert results == [200, 200, 200]
    assert http.post("/v1/audio/speech", json={"input": "hi"}).status_code == 200
    assert 'higgs_serve_requests_total{outcome="rejected"} 1.0' in http.get("/metrics").text


def test_client_disconnect_mid_stream_aborts_and_frees_the_slot(fake_server, http):
    engine = fake_server.engine
    engine.step_delay_s = 0.02  # ~20 chunks of 5 frames: about 0.4 s if nobody aborts
    try:
        with httpx.Client(base_url=fake_server.url, timeout=10) as client:
            with client.stream("POST", "/v1/audio/speech", json={
                    "input": "x" * 50, "response_format": "pcm", "stream": True}) as response:
                assert response.status_code == 200
                request_id = response.headers["x-request-id"]
                next(response.iter_raw())  # one chunk, then hang up
        deadline = time.monotonic() + 2
        while request_id not in engine.aborted:
            assert time.monotonic() < deadline, "the engine request was never aborted"
            time.sleep(0.01)
        assert _gauge(http, "higgs_serve_server_in_flight_requests") == 0
        assert _gauge(http, "higgs_serve_running_requests") == 0
        free, total = (_gauge(http, f"higgs_serve_kv_blocks_{kind}") for kind in ("free", "total"))
        assert free == total
    finally:
        engine.step_delay_s = 0.0
    assert http.post("/v1/audio/speech", json={"input": "hi"}).status_code == 200


# ----------------------------------------------------------------------------- lifecycle
def test_not_ready_before_start_and_api_key(tmp_path):
    """Without the lifespan the engine never starts: /ready and speech are 503, /health 200."""
    app = build_app(FakeEngine(deploy=fake_deploy()), fake_settings(tmp_path, api_key="s3cret"))
    asyncio.run(_check_not_ready_and_api_key(app))


async def _check_not_ready_and_api_key(app) -> None:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        assert (await client.get("/health")).status_code == 200
        assert (await client.get("/ready")).status_code == 503
        body = {"input": "hi"}
        unauthorised = await client.post("/v1/audio/speech", json=body)
        assert unauthorised.status_code == 401
        assert unauthorised.json()["error"]["code"] == "invalid_api_key"
        wrong = await client.post("/v1/audio/speech", json=body,
                                  headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        good_key = {"Authorization": "Bearer s3cret"}
        not_ready = await client.post("/v1/audio/speech", json=body, headers=good_key)
        assert not_ready.status_code == 503 and not_ready.headers["retry-after"] == "1"
        assert (await client.get("/v1/audio/voices", headers=good_key)).status_code == 200


def test_engine_death_turns_health_503(tmp_path):
    engine = FakeEngine(deploy=fake_deploy())
    live = start_threaded_server(engine, fake_settings(tmp_path))
    try:
        with httpx.Client(base_url=live.url, timeout=5) as client:
            assert client.get("/health").status_code == 200
            engine.kill()
            assert client.get("/health").status_code == 503
            assert client.get("/ready").status_code == 503
            response = client.post("/v1/audio/speech", json={"input": "hi"})
            assert response.status_code == 503
            assert response.json()["error"]["code"] == "engine_dead"
    finally:
        live.stop()


def test_engine_failure_mid_stream_becomes_an_sse_error_event(tmp_path):
    engine = FakeEngine(deploy=fake_deploy(), step_delay_s=0.02)
    live = start_threaded_server(engine, fake_settings(tmp_path))
    try:
        with httpx.Client(base_url=live.url, timeout=5) as client:
            with client.stream("POST", "/v1/audio/speech", json={
                    "input": "x" * 40, "response_format": "pcm", "stream_format": "sse"}) as r:
                lines = r.iter_lines()
                first = next(lines)
                assert first.startswith("event: speech.audio.delta")
                engine.kill()
                events = parse_sse("\n".join([first, *lines]))
            assert events[-1]["type"] == "speech.audio.error"
            assert events[-1]["partial_audio"] is True
            assert events[-1]["error"]["code"] == "engine_dead"
    finally:
        live.stop()


def test_fuzzed_requests_never_get_a_5xx(fake_server, http):
    openapi = http.get("/openapi.json").json()
    assert not any("422" in operation.get("responses", {})
                   for path in openapi["paths"].values() for operation in path.values())
    fuzz_server(fake_server.url, clamp_frame_fields(openapi, 50), max_examples=8)


def test_client_leaving_a_non_streamed_request_aborts_it(fake_server, http):
    engine = fake_server.engine
    engine.hold.clear()
    aborted_before = len(engine.aborted)
    try:
        with pytest.raises(httpx.ReadTimeout):
            http.post("/v1/audio/speech", json={"input": "HOLD then leave"}, timeout=0.3)
        deadline = time.monotonic() + 2
        while len(engine.aborted) == aborted_before:
            assert time.monotonic() < deadline, "the engine request was never aborted"
            time.sleep(0.01)
        assert _gauge(http, "higgs_serve_server_in_flight_requests") == 0
    finally:
        engine.hold.set()
