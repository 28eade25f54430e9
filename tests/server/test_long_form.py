"""Long-form /v1/audio/speech against the real engine (tiny checkpoint) behind real uvicorn:
an input of 24 sentences (about 3,000 characters) answered as a file, a raw stream and SSE in
one recording; segment timestamps cover the input in order with no gap; each segment's request
holds the previous segment's generated codes as its clone reference (read from the requests the
server submitted and from the prompt the engine core builds of them); joins carry no step.

Every segment is capped at FRAMES frames (the tiny model's random weights never stop on their own).
"""

from __future__ import annotations

import base64
import io
import json
import time

import httpx
import numpy as np
import pytest
import soundfile as sf
from live_engine import start_live_engine_server
from live_server import metric

from higgs_serve.model.delay_pattern import apply_delay
from higgs_serve.server.settings import ServerSettings

FRAMES = 4
SEED = 11
SEGMENT_CHARS = 300
RATE = 24000
TOPICS = ["The river", "Dr. Moreau's lab", "A 3.5 km trail", "The old library", "Our team",
          "The summit", "That winter", "The market"]
ARTICLE = " ".join(
    f"{TOPICS[i % len(TOPICS)]} was described in chapter {i + 1}, e.g. in the notes. "
    f"It took about {i + 2}.5 hours, and nobody said a word about it afterwards!"
    for i in range(24))
FIXED = {"max_new_tokens": FRAMES, "seed": SEED}


@pytest.fixture(scope="module")
def live(tiny_model_dir, tmp_path_factory):
    settings = ServerSettings(served_model_name="higgs-tiny", segment_max_chars=SEGMENT_CHARS,
                              voices_dir=tmp_path_factory.mktemp("voices"), max_queue=2)
    server = start_live_engine_server(tiny_model_dir, settings)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def http(live):
    with httpx.Client(base_url=live.url, timeout=120) as client:
        yield client


def _pcm(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def _check_timestamps(segments: list[list], num_samples: int) -> None:
    """[[char_start, char_end, start_s, end_s], ...] covers ARTICLE and the audio, in order."""
    assert segments[0][0] == 0 and segments[-1][1] == len(ARTICLE)
    assert segments[0][2] == 0.0
    assert segments[-1][3] == pytest.approx(num_samples / RATE, abs=1e-6)
    for a, b in zip(segments, segments[1:]):
        assert a[1] <= b[0] and not ARTICLE[a[1]:b[0]].strip()  # only whitespace between
        assert a[3] == b[2]  # gapless: one ends where the next starts
    for start, end, t0, t1 in segments:
        assert 0 < end - start <= SEGMENT_CHARS and t1 > t0


def test_article_is_long():
    assert len(ARTICLE) > 3000 and ARTICLE.count("!") == 24


def test_file_response_with_segment_header(http, live):
    live.engine.submitted.clear()
    r = http.post("/v1/audio/speech", json={"input": ARTICLE, "response_format": "wav",
                                            "stream": False, **FIXED})
    assert r.status_code == 200, r.text
    audio, rate = sf.read(io.BytesIO(r.content), dtype="float32")
    segments = json.loads(r.headers["x-segments"])
    assert int(r.headers["x-segment-count"]) == len(segments) == len(live.engine.submitted) >= 10
    assert len(audio) == len(segments) * FRAMES * 960
    _check_timestamps(segments, len(audio))
    assert r.headers["x-usage-output-tokens"] == str(len(segments) * FRAMES)
    assert r.headers["x-finish-reason"] == "length"  # every segment hit its frame cap


def test_raw_stream_and_sse_are_one_recording(http):
    raw = http.post("/v1/audio/speech", json={"input": ARTICLE, "response_format": "pcm",
                                              "stream": True, **FIXED})
    assert raw.status_code == 200 and float(raw.headers["x-time-to-first-audio-ms"]) > 0
    events = []
    with http.stream("POST", "/v1/audio/speech", json={
            "input": ARTICLE, "response_format": "pcm", "stream_format": "sse", **FIXED}) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "speech.audio.done"
    audio = b"".join(base64.b64decode(e["audio"]) for e in events
                     if e["type"] == "speech.audio.delta")
    assert audio == raw.content  # same seed, same segments, same stream windows
    per_segment = [e for e in events if e["type"] == "speech.segment.done"]
    done = events[-1]
    assert [e["index"] for e in per_segment] == list(range(len(per_segment)))
    assert done["segments"] == [{k: v for k, v in e.items() if k != "type"} for e in per_segment]
    # each segment's event comes right after its own audio, before the next segment's
    first_done = kinds.index("speech.segment.done")
    assert 0 < first_done < kinds.index("speech.segment.done", first_done + 1)
    compact = [[s["char_start"], s["char_end"], s["start_s"], s["end_s"]] for s in done["segments"]]
    _check_timestamps(compact, len(audio) // 2)
    assert done["usage"]["output_tokens"] == FRAMES * len(per_segment)


def test_each_segment_is_cloned_from_the_one_before(http, live, monkeypatch):
    core = live.engine.inner.core
    scheduled = []  # the engine's own requests, as the scheduler receives them
    add_request = core.scheduler.add_request
    monkeypatch.setattr(core.scheduler, "add_request",
                        lambda request: (scheduled.append(request), add_request(request))[1])
    live.engine.submitted.clear()
    r = http.post("/v1/audio/speech", json={"input": ARTICLE, "response_format": "pcm",
                                            "stream": True, **FIXED})
    assert r.status_code == 200
    submitted = live.engine.submitted
    assert len(scheduled) == len(submitted)
    assert submitted[0][0].reference is None  # zero-shot: the first segment sets the voice
    assert scheduled[0].num_placeholders == 0
    for k in range(1, len(submitted)):
        request, (previous, previous_stream) = submitted[k][0], submitted[k - 1]
        assert request.sampling.seed == SEED + k
        codes = previous_stream.frames  # [T, 8]: what segment k-1 generated
        assert codes.shape == (FRAMES, 8)
        np.testing.assert_array_equal(request.reference.codes, codes)
        assert request.reference.ref_text == previous.text
        # the prompt the engine runs: ref_text tokens, then segment k-1's codes (delayed) at the
        # reference positions
        prompt = scheduled[k]
        np.testing.assert_array_equal(np.array(prompt.placeholder_rows),
                                      apply_delay(codes))
        ref_tokens = live.engine.inner.prompt_builder.tok(previous.text)
        ids = list(prompt.prompt_token_ids[:prompt.placeholder_start])
        assert ref_tokens and any(ids[i:i + len(ref_tokens)] == ref_tokens for i in range(len(ids)))


def test_joins_have_no_step(http):
    r = http.post("/v1/audio/speech", json={"input": ARTICLE, "response_format": "pcm",
                                            "stream": True, **FIXED})
    audio = _pcm(r.content)
    seg = FRAMES * 960
    joins = np.arange(seg, len(audio), seg)
    steps = np.abs(np.diff(audio))
    join_steps = steps[joins - 1]  # audio[j] - audio[j - 1] at each join j
    inside = np.delete(steps, joins - 1)
    # the ramp makes each segment start at the previous one's last sample: a step of at most
    # one int16 rounding, where the random model's own audio steps far more between samples
    assert join_steps.max() <= 1.01 / 32768
    assert np.median(inside) > 100 / 32768


def test_request_reference_conditions_every_segment(http, live):
    clip = (0.3 * np.sin(2 * np.pi * 220 * np.arange(RATE) / RATE)).astype(np.float32)
    buffer = io.BytesIO()
    sf.write(buffer, clip, RATE, format="WAV", subtype="PCM_16")
    live.engine.submitted.clear()
    r = http.post("/v1/audio/speech", json={
        "input": ARTICLE[:900], "response_format": "pcm", "ref_text": "A tone.",
        "ref_audio": base64.b64encode(buffer.getvalue()).decode(), **FIXED})
    assert r.status_code == 200, r.text
    keys = {req.reference.content_key for req, _ in live.engine.submitted}
    texts = {req.reference.ref_text for req, _ in live.engine.submitted}
    assert len(live.engine.submitted) >= 3 and len(keys) == 1 and texts == {"A tone."}


def test_short_input_is_one_request(http, live):
    live.engine.submitted.clear()
    r = http.post("/v1/audio/speech", json={"input": "Short. Two sentences.", **FIXED})
    assert r.status_code == 200 and "x-segments" not in r.headers
    assert len(live.engine.submitted) == 1


def test_a_refused_chain_counts_invalid_like_a_single_request(http):
    """min_new_tokens above the short first segment's frame cap: the engine refuses it (400 naming
    the field) before any audio, and the request counts "invalid", as a single one does (the
    long-form start counted it "error")."""
    invalid = metric(http, 'higgs_serve_requests_total{outcome="invalid"}')
    errors = metric(http, 'higgs_serve_requests_total{outcome="error"}')
    text = "Hi. " + " ".join(["word"] * 70) + "."  # segments: "Hi." (a cap of ~125 frames), ...
    r = http.post("/v1/audio/speech", json={"input": text, "max_new_tokens": 200,
                                            "min_new_tokens": 200})
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_new_tokens", r.text
    assert metric(http, 'higgs_serve_requests_total{outcome="invalid"}') == invalid + 1
    assert metric(http, 'higgs_serve_requests_total{outcome="error"}') == errors


def test_total_audio_is_capped(tiny_model_dir, tmp_path):
    settings = ServerSettings(served_model_name="t", segment_max_chars=SEGMENT_CHARS,
                              voices_dir=tmp_path, max_audio_s=1.0)
    server = start_live_engine_server(tiny_model_dir, settings)
    try:
        r = httpx.post(f"{server.url}/v1/audio/speech", timeout=60, json={
            "input": ARTICLE, "response_format": "pcm", "max_new_tokens": 10, "seed": 1,
            "stream": False})
        assert r.status_code == 200
        assert len(r.content) == 2 * RATE  # exactly max_audio_s
        assert r.headers["x-finish-reason"] == "length"
        assert len(server.engine.submitted) == 3  # 0.4 s + 0.4 s + the 0.2 s that fit
    finally:
        server.stop()


def test_client_leaving_mid_stream_aborts_the_chain(http, live):
    core, gate = live.engine.inner.core, live.app.state.server.gate
    aborts = metric(http, 'higgs_serve_requests_total{outcome="abort"}')
    live.engine.submitted.clear()
    with http.stream("POST", "/v1/audio/speech", json={
            "input": ARTICLE, "response_format": "pcm", "stream": True, "max_new_tokens": 150,
            "seed": 1}) as r:
        next(r.iter_bytes())  # audio is flowing
    deadline = time.monotonic() + 5
    while core.stats()["num_active"] or gate.in_flight:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert len(live.engine.submitted) == 1  # the chain stopped at the segment being spoken
    assert metric(http, 'higgs_serve_requests_total{outcome="abort"}') == aborts + 1


def test_delivery_tags_reach_every_later_segment(http, live):
    text = "<|emotion:happy|> " + ARTICLE[:700]
    live.engine.submitted.clear()
    r = http.post("/v1/audio/speech", json={"input": text, "response_format": "pcm", **FIXED})
    assert r.status_code == 200
    texts = [request.text for request, _ in live.engine.submitted]
    assert len(texts) >= 3 and all(t.startswith("<|emotion:happy|>") for t in texts)
    # the chained reference's transcript is the previous segment's words, tags removed
    assert all("<|" not in request.reference.ref_text for request, _ in live.engine.submitted[1:])


def test_speed_scales_the_file_timestamps(http):
    r = http.post("/v1/audio/speech", json={"input": ARTICLE[:900], "response_format": "wav",
                                            "speed": 2.0, "stream": False, **FIXED})
    assert r.status_code == 200, r.text
    audio, rate = sf.read(io.BytesIO(r.content), dtype="float32")
    segments = json.loads(r.headers["x-segments"])
    assert segments[-1][3] == pytest.approx(len(audio) / rate, abs=1e-4)
    assert len(audio) < len(segments) * FRAMES * 960 * 0.6  # about half as long


def test_segment_header_is_bounded():
    from higgs_serve.server.run.long_form import MAX_SEGMENTS_HEADER_BYTES, _segments_header
    timing = {"char_start": 12345, "char_end": 12645, "start_s": 1234.56789, "end_s": 1250.0}
    few, many = _segments_header([timing] * 10), _segments_header([timing] * 2000)
    assert json.loads(few["X-Segments"])[0] == [12345, 12645, 1234.56789, 1250.0]
    assert many == {"X-Segments-Omitted": "2000"}
    assert len(_segments_header([timing] * 300).get("X-Segments", "")) <= MAX_SEGMENTS_HEADER_BYTES
