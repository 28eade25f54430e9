"""End to end: the real server (`python -m higgs_serve.cli serve <tiny model>`) in a subprocess on
a free loopback port, driven by the official openai client and raw httpx.

One server for the whole module; requests are short (fixed 20-frame utterances; only the
disconnect and overload tests start longer streams, and abort them), so the module costs about
the server's start-up time.
"""

from __future__ import annotations

import base64
import io
import json
import threading
import time
import wave

import av
import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from bad_requests import bad_requests, post_bad_request
from fuzz import clamp_frame_fields, fuzz_server
from live_server import metric, serve_subprocess
from support.decoders import CODEC_FRAME, STREAM_DELAY, av_decode

from higgs_serve.audio.formats import FORMATS
from higgs_serve.codec.chunker import StreamChunker, WindowParams
from higgs_serve.codec.decoder import receptive_field_frames

NAME = "higgs-tiny"
RATE = 24000
FRAMES = 20  # every good request asks for exactly this many frames (min = max)
MAX_TOKENS = 200  # the profile's ceiling, set on the command line; only held streams use it
MAX_INPUT_CHARS = 200
TEXT = "Hello there."
FIXED = {"max_new_tokens": FRAMES, "min_new_tokens": FRAMES}


@pytest.fixture(scope="module")
def real_server(tiny_model_dir, tmp_path_factory):
    work = tmp_path_factory.mktemp("real_server")
    # the default profile: the deadline policy off (streams of one seed are compared byte for byte
    # across requests; the overload test holds a queued stream: it waits, test_over_capacity.py
    # pins the policy's 503)
    overrides = json.dumps({"0": {"default_sampling_params": {"max_tokens": MAX_TOKENS},
                                  "compilation_config": {"cudagraph_capture_sizes": [1, 2]}}})
    with serve_subprocess(tiny_model_dir, work, [
        "--served-model-name", NAME, "--max-num-seqs", "2", "--max-queue", "1",
        "--max-input-chars", str(MAX_INPUT_CHARS), "--voices-dir", str(work / "voices"),
        "--stage-overrides", overrides,
        # these tests compare streamed audio with files of the same seed frame by frame (the
        # codec's windows); the mark is causal per chunk, so a stream's chunk ends carry a
        # slightly different mark than a file's (docs/model.md#watermark): off here, as in the
        # engine tests. Every endpoint marked: test_watermark_endpoints.py.
        "--watermark", "off",
    ]) as server:
        yield server
    # the server has exited (serve_subprocess asserted its exit code)
    assert "Application shutdown complete" in open(server.log_path).read()


@pytest.fixture(scope="module")
def http(real_server):
    with httpx.Client(base_url=real_server.url, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def oai(real_server):
    return openai.OpenAI(base_url=f"{real_server.url}/v1", api_key="unused", max_retries=0,
                         timeout=30)


def _pcm(http: httpx.Client, seed: int) -> bytes:
    """One file (stream: false: the exact file windows)."""
    response = http.post("/v1/audio/speech", json={"model": NAME, "input": TEXT, "seed": seed,
                                                   "response_format": "pcm", "stream": False,
                                                   **FIXED})
    assert response.status_code == 200, response.text
    return response.content


def _int16(data: bytes) -> np.ndarray:
    return np.frombuffer(data, "<i2").astype(np.int32)


@pytest.fixture(scope="module")
def near_seams(tiny_spec) -> np.ndarray:
    """[FRAMES] bool: frames whose streamed audio may differ from the one-shot decode. Each
    streamed window (docs/model.md#streaming-windows, the default profile's chunk schedule) is decoded without the
    frames past its holdback, which the last (right receptive field - H) frames before its seam
    can see; with the tiny random codec they differ at full scale."""
    params = WindowParams()
    chunker, seams, sent = StreamChunker(params), [], 0
    for available in range(1, FRAMES + 1):
        window = chunker.push(available, finished=False)
        if window is not None:
            sent += window.new_frames
            seams.append(sent)
    reach = receptive_field_frames(tiny_spec.codec)[1] - params.right_holdback_frames
    mask = np.zeros(FRAMES, dtype=bool)
    for seam in seams:
        mask[max(0, seam - reach) : seam] = True
    assert not mask.all()
    return mask


def assert_matches_file(streamed: bytes, file: bytes, near_seams: np.ndarray) -> None:
    """Same length; every frame away from a window seam identical to the file's (one-shot)."""
    assert len(streamed) == len(file) == FRAMES * 960 * 2
    frame_error = np.abs(_int16(streamed) - _int16(file)).reshape(FRAMES, 960).max(axis=1)
    assert (frame_error[~near_seams] <= 2).all(), frame_error


def test_ready_models_health(http):
    assert http.get("/health").json() == {"status": "ok"}
    assert http.get("/ready").status_code == 200
    assert http.get("/v1/models").json()["data"][0]["id"] == NAME


def _streamed_pcm(http: httpx.Client, seed: int) -> bytes:
    response = http.post("/v1/audio/speech", json={"model": NAME, "input": TEXT, "seed": seed,
                                                   "response_format": "pcm", "stream": True,
                                                   **FIXED})
    assert response.status_code == 200, response.text
    return response.content


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_every_format_streams_and_matches_the_streamed_pcm(oai, http, fmt):
    """Every format streams (the SDK's create with `stream: true`; without it too, but wav and
    flac); the stream decodes whole (FFmpeg's libraries, PyAV) to the streamed pcm of the same
    seed: lossless exactly, G.711 within its step, lossy codecs within one codec frame of padding
    beyond the delay a stream cannot carry (docs/api.md#formats)."""
    rate = FORMATS[fmt].default_rate_hz or RATE
    response = oai.audio.speech.with_raw_response.create(
        model=NAME, input=TEXT, voice="default", response_format=fmt,
        extra_body={"seed": 3, "sample_rate": rate, "stream": True, **FIXED})
    assert "content-length" not in response.headers  # streamed (chunked)
    decoded = av_decode(response.content, fmt, rate)
    pcm = np.frombuffer(_streamed_pcm(http, 3), "<i2")
    assert pcm.size == FRAMES * 960
    if fmt in ("wav", "pcm", "flac"):
        assert np.array_equal(decoded, pcm)
    elif fmt in ("ulaw", "alaw"):  # 8 kHz: against the same request's pcm at 8 kHz
        reference = np.frombuffer(http.post("/v1/audio/speech", json={
            "input": TEXT, "seed": 3, "response_format": "pcm", "sample_rate": rate,
            **FIXED}).content, "<i2").astype(np.int32)
        assert decoded.size == reference.size == FRAMES * 320
        assert np.all(np.abs(decoded - reference) <= np.abs(reference) // 16 + 32)
    else:
        extra = decoded.size - pcm.size - STREAM_DELAY[fmt]
        assert 0 <= extra < CODEC_FRAME[fmt](rate), (fmt, decoded.size)


# what each reader says a file lasts: soundfile (libsndfile: no AAC), PyAV's header (FFmpeg's
# libraries) and the standard library's wave for WAV; each with what FFmpeg decodes
README_FILES = ("wav", "flac", "mp3", "opus", "aac")


@pytest.mark.parametrize("fmt", README_FILES)
def test_a_file_saved_without_stream_reads_to_its_length_everywhere(oai, tmp_path, fmt):
    """Issue 50: the README's first examples save a request without `stream` (the SDK's
    `create(...).write_to_file`, curl `-o`). Every reader must find the audio's length: exactly
    in wav and flac (sent as files: their header states it) and Ogg/Opus (pre-skip and end
    granule; its header also counts the 6.5 ms pre-skip); within the codec delay a stream cannot
    carry and one frame of padding in mp3 and aac (docs/api.md#formats)."""
    path = tmp_path / f"hello.{fmt}"
    oai.audio.speech.create(model=NAME, voice="default", input=TEXT, response_format=fmt,
                            extra_body={"seed": 7, **FIXED}).write_to_file(path)
    samples = FRAMES * 960
    low_s = (samples + STREAM_DELAY.get(fmt, 0)) / RATE
    high_s = low_s + (CODEC_FRAME[fmt](RATE) if fmt in ("mp3", "aac") else 0) / RATE
    slack_s = 0.0065 if fmt == "opus" else 1e-6
    said = {"FFmpeg decodes": av_decode(path.read_bytes(), fmt, RATE).size / RATE}
    with av.open(str(path)) as container:
        said["PyAV header"] = container.duration / 1e6
    if fmt != "aac":
        said["soundfile header"] = sf.info(str(path)).duration
        said["soundfile reads"] = sf.read(str(path))[0].shape[0] / RATE
    if fmt == "wav":
        with wave.open(str(path)) as handle:
            said["wave header"] = handle.getnframes() / handle.getframerate()
            said["wave reads"] = len(handle.readframes(handle.getnframes())) / 2 / RATE
    wrong = {reader: s for reader, s in said.items() if not low_s - 1e-6 <= s <= high_s + slack_s}
    assert not wrong, (fmt, low_s, wrong)


def test_the_streaming_rule_streams_without_stream_and_files_use_file_windows(http, near_seams):
    """docs/api.md#streaming: a request without `stream` is the `stream: true` stream, byte for
    byte (streaming windows); `stream: false` is one file with its Content-Length whose frames
    are the one-shot decode's (file windows), differing from the stream only near its seams; a
    wav or flac request without `stream` is that file (its header states the length)."""
    body = {"model": NAME, "input": TEXT, "seed": 4, "response_format": "pcm", **FIXED}
    default = http.post("/v1/audio/speech", json=body)
    assert "content-length" not in default.headers
    assert default.content == _streamed_pcm_of(http, body)
    file = http.post("/v1/audio/speech", json={**body, "stream": False})
    assert int(file.headers["content-length"]) == len(file.content)
    assert file.headers["x-usage-output-tokens"] == str(FRAMES)
    assert_matches_file(default.content, file.content, near_seams)
    assert default.content != file.content  # the tiny codec's seams do differ
    wav = {**body, "response_format": "wav"}
    wav_default = http.post("/v1/audio/speech", json=wav)
    assert int(wav_default.headers["content-length"]) == len(wav_default.content)
    assert wav_default.content == http.post("/v1/audio/speech", json={**wav, "stream": False}).content
    assert wav_default.content[44:] == file.content  # the pcm file's samples


def _streamed_pcm_of(http: httpx.Client, body: dict) -> bytes:
    return http.post("/v1/audio/speech", json={**body, "stream": True}).content


def test_seed_gives_identical_audio(http):
    first, second = _pcm(http, 42), _pcm(http, 42)
    assert first == second
    assert _pcm(http, 43) != first


@pytest.mark.parametrize("fmt", ["pcm", "wav"])
def test_raw_stream_matches_the_file(oai, http, fmt, near_seams):
    with oai.audio.speech.with_streaming_response.create(
            model=NAME, input=TEXT, voice="default", response_format=fmt,
            stream_format="audio", extra_body={"seed": 5, **FIXED}) as response:
        assert response.headers["x-sample-rate"] == "24000"
        body = b"".join(response.iter_bytes())
    if fmt == "wav":
        audio, rate = sf.read(io.BytesIO(body), dtype="int16")
        assert rate == RATE
        body = audio.astype("<i2").tobytes()
    assert_matches_file(body, _pcm(http, 5), near_seams)


def test_sse_deltas_equal_the_file_and_usage_is_right(oai, http, near_seams):
    with oai.audio.speech.with_streaming_response.create(
            model=NAME, input=TEXT, voice="default", response_format="pcm",
            stream_format="sse", extra_body={"seed": 9, **FIXED}) as response:
        text = response.read().decode()
    events = [json.loads(line[len("data: "):]) for line in text.splitlines()
              if line.startswith("data: ")]
    deltas, done = events[:-1], events[-1]
    assert deltas and all(e["type"] == "speech.audio.delta" for e in deltas)
    streamed = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    raw_stream = http.post("/v1/audio/speech", json={
        "input": TEXT, "seed": 9, "response_format": "pcm", "stream": True, **FIXED})
    assert streamed == raw_stream.content  # same windows, same bytes
    file_response = http.post("/v1/audio/speech", json={
        "input": TEXT, "seed": 9, "response_format": "pcm", "stream": False, **FIXED})
    assert_matches_file(streamed, file_response.content, near_seams)
    input_tokens = int(file_response.headers["x-usage-input-tokens"])
    assert input_tokens > 0
    assert done == {"type": "speech.audio.done", "finish_reason": "length", "usage": {
        "input_tokens": input_tokens, "output_tokens": FRAMES,
        "total_tokens": input_tokens + FRAMES}}


def test_bad_requests_then_the_engine_still_serves(http):
    for case, body, status, param in bad_requests(MAX_INPUT_CHARS, MAX_TOKENS):
        try:
            post_bad_request(http, body, status, param)
        except AssertionError as error:
            raise AssertionError(f"case {case!r}: {error}") from error
    assert http.get("/health").status_code == 200
    assert len(_pcm(http, 1)) == FRAMES * 960 * 2


def test_min_new_tokens_above_the_text_frame_cap_is_a_400_naming_the_limit(http):
    """Issue 27 item 6: min_new_tokens above what the text allows is refused, not cut short."""
    body = {"input": "hi", "response_format": "pcm", "max_new_tokens": MAX_TOKENS, "min_new_tokens": MAX_TOKENS}
    post_bad_request(http, body, 400, "min_new_tokens")
    message = http.post("/v1/audio/speech", json=body).json()["error"]["message"]
    assert f"min_new_tokens={MAX_TOKENS}" in message and "frame limit of this text: 125 frames" in message
    assert len(_pcm(http, 1)) == FRAMES * 960 * 2  # the engine still serves


def test_codec_counters_count_the_windows_of_a_request(http):
    names = ("higgs_serve_codec_calls_total", "higgs_serve_codec_windows_total",
             "higgs_serve_codec_busy_seconds_total", "higgs_serve_codec_graph_calls_total")
    before = [metric(http, name) for name in names]
    _pcm(http, 7)  # stream: false: one window for the whole clip
    calls, windows, busy, graph_calls = (metric(http, n) - b for n, b in zip(names, before))
    assert (calls, windows, graph_calls) == (1, 1, 0)  # CPU: eager
    assert busy > 0


def test_stage0_step_counters_say_how_each_step_ran(http):
    """A CPU server runs every step eagerly (no graphs, no launch tapes: those are CUDA's), so a
    request's steps are all mode none and all op by op; the other samples exist at 0."""
    modes = [f'higgs_serve_stage0_steps_total{{mode="{m}"}}' for m in ("none", "local_mlp", "piecewise", "full")]
    outcomes = [f'higgs_serve_eager_steps_total{{outcome="{o}"}}' for o in ("op_by_op", "replay", "recorded", "void")]
    before = [metric(http, name) for name in modes + outcomes]
    steps = metric(http, "higgs_serve_stage0_step_seconds_count")
    _pcm(http, 7)
    none, local_mlp, piecewise, full, op_by_op, replay, recorded, void = (
        metric(http, name) - b for name, b in zip(modes + outcomes, before))
    assert none == op_by_op == metric(http, "higgs_serve_stage0_step_seconds_count") - steps > 0
    assert local_mlp == piecewise == full == replay == recorded == void == 0


def _idle_state(http: httpx.Client) -> tuple[float, float, float]:
    return (metric(http, "higgs_serve_server_in_flight_requests"),
            metric(http, "higgs_serve_running_requests"),
            metric(http, "higgs_serve_kv_blocks_free"))


def _wait_for(http: httpx.Client, expected, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (state := _idle_state(http)) != expected:
        assert time.monotonic() < deadline, f"engine state {state}, expected {expected}"
        time.sleep(0.02)


def _long_stream_body() -> dict:
    # 200 frames at ~10 ms per CPU step: still running when the test hangs up.
    return {"input": "A longer sentence to keep the engine busy.", "response_format": "pcm",
            "stream": True, "max_new_tokens": MAX_TOKENS, "min_new_tokens": MAX_TOKENS}


def test_disconnect_mid_stream_frees_the_slot_and_kv_blocks(real_server, http):
    idle = _idle_state(http)
    assert idle[:2] == (0, 0)
    aborted = metric(http, 'higgs_serve_requests_total{outcome="abort"}')
    with httpx.Client(base_url=real_server.url, timeout=30) as client:
        with client.stream("POST", "/v1/audio/speech", json=_long_stream_body()) as response:
            assert response.status_code == 200
            next(response.iter_raw())  # first audio, then hang up
    _wait_for(http, idle)
    assert metric(http, 'higgs_serve_requests_total{outcome="abort"}') == aborted + 1
    assert len(_pcm(http, 2)) == FRAMES * 960 * 2


def test_overload_is_an_immediate_429_then_recovers(real_server, http):
    idle = _idle_state(http)
    release = threading.Event()
    statuses: list[int] = []

    def hold_a_slot() -> None:
        with httpx.Client(base_url=real_server.url, timeout=30) as client:
            with client.stream("POST", "/v1/audio/speech", json=_long_stream_body()) as response:
                statuses.append(response.status_code)
                release.wait(timeout=20)

    holders = [threading.Thread(target=hold_a_slot) for _ in range(3)]  # 2 slots + 1 queued
    for holder in holders:
        holder.start()
    try:
        deadline = time.monotonic() + 10
        while metric(http, "higgs_serve_server_in_flight_requests") < 3:
            assert time.monotonic() < deadline, "the three requests were never admitted"
            time.sleep(0.02)
        started = time.perf_counter()
        rejected = http.post("/v1/audio/speech", json={"input": "hi", **FIXED})
        assert time.perf_counter() - started < 0.5
        assert rejected.status_code == 429 and rejected.headers["retry-after"] == "1"
        assert rejected.json()["error"]["code"] == "queue_full"
    finally:
        release.set()
        for holder in holders:
            holder.join(timeout=30)
    assert statuses == [200, 200, 200]
    _wait_for(http, idle)
    assert len(_pcm(http, 4)) == FRAMES * 960 * 2
    metrics = http.get("/metrics").text
    assert 'higgs_serve_requests_total{outcome="rejected"} 1.0' in metrics
    assert metric(http, "higgs_serve_stage0_step_seconds_count") > 0
    assert metric(http, "higgs_serve_stage0_rows_total") >= 4 * FRAMES  # every request's frames were sampled
    assert metric(http, "higgs_serve_ttfa_seconds_count") > 0


# ----------------------------------------------------------------------------- schemathesis
def test_fuzzed_requests_never_get_a_5xx_nor_kill_the_engine(real_server):
    openapi = httpx.get(f"{real_server.url}/openapi.json").json()
    fuzz_server(real_server.url, clamp_frame_fields(openapi, FRAMES), max_examples=3)
