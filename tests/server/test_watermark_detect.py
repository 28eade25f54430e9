"""POST /v1/audio/watermark/detect on a real uvicorn server: files in the formats the server reads
and headerless samples, the answer's shape, and every refusal in OpenAI's error shape (the API
key on it is checked with every /v1 route in test_auth_and_urls.py)."""

from __future__ import annotations

import io
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import soundfile as sf

from higgs_serve.audio.watermark import THRESHOLD, embed, load_watermarker
from higgs_serve.audio.watermark_detect import DETECT_MAX_BYTES
from support.decoders import av_encode
from support.speechlike import speechlike

PATH = "/v1/audio/watermark/detect"


@pytest.fixture(scope="module")
def clips():
    audio = speechlike(6.0, 11)
    return embed(load_watermarker(), audio), audio


def _file(audio: np.ndarray, fmt: str, rate: int = 24_000) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, audio, rate, format=fmt)
    return buffer.getvalue()


def _post(server, data: bytes, **fields) -> httpx.Response:
    return httpx.post(f"{server.url}{PATH}", files={"file": ("clip", data)},
                      data={k: str(v) for k, v in fields.items()}, timeout=60)


def test_marked_and_unmarked_files(fake_server, clips):
    marked, plain = clips
    for fmt in ("WAV", "FLAC", "MP3"):
        got = _post(fake_server, _file(marked, fmt))
        assert got.status_code == 200, got.text
        assert set(got.json()) == {"detected", "verdict", "reason", "score"} and got.json()["reason"] is None
        assert got.json()["detected"] is True and got.json()["score"] >= THRESHOLD, fmt
        assert got.json()["verdict"] == "marked"
        got = _post(fake_server, _file(plain, fmt)).json()
        assert got["detected"] is False and got["score"] < THRESHOLD and got["verdict"] == "not_marked", fmt
    assert _post(fake_server, av_encode(marked, 24_000, "aac", "adts", bit_rate=64_000)).json()["detected"]


def test_headerless_samples(fake_server, clips):
    marked, _ = clips
    pcm = (np.clip(marked, -1, 1) * 32767).astype("<i2").tobytes()
    assert _post(fake_server, pcm, format="pcm").json()["detected"] is True
    ulaw = av_encode(marked, 24_000, "pcm_mulaw", "mulaw", out_rate_hz=8000)
    assert _post(fake_server, ulaw, format="ulaw", sample_rate=8000).json()["detected"] is True
    # the wrong rate for the same bytes: read as 3x faster speech, not the mark's band any more
    assert _post(fake_server, ulaw, format="ulaw", sample_rate=24000).json()["detected"] is False


@pytest.mark.parametrize("case", ["junk", "empty", "unknown_field", "rate_without_format", "bad_format", "too_long",
                                  "rate_zero"])
def test_refusals_are_400_naming_the_field(fake_server, clips, case):
    marked, _ = clips
    data, fields, param, words = {
        "junk": (b"this is not audio" * 20, {}, "file", "is not a supported audio file"),
        "empty": (b"", {}, "file", "file is empty"),
        "unknown_field": (_file(marked, "WAV"), {"threshold": 0.2}, "threshold", "unknown field(s): threshold"),
        "rate_without_format": (_file(marked, "WAV"), {"sample_rate": 16000}, "sample_rate", "give format"),
        "bad_format": (_file(marked, "WAV"), {"format": "mp3"}, "format", "not a headerless encoding"),
        "too_long": (_file(np.zeros(8000 * 301, np.float32), "WAV", 8000), {}, "file",
                     "audio to check may be at most 300 s"),
        # issue 52: 0 was read as "the default rate"
        "rate_zero": (b"\0\0" * 24_000, {"format": "pcm", "sample_rate": 0}, "sample_rate",
                      "give a rate from 8000 to 192000 Hz"),
    }[case]
    got = _post(fake_server, data, **fields)
    assert got.status_code == 400, got.text
    error = got.json()["error"]
    assert error["param"] == param and words in error["message"] and error["type"] == "invalid_request_error"


def _tone(freq: float, seconds: float = 5.0, rate: int = 24_000) -> np.ndarray:
    return (0.3 * np.sin(2 * np.pi * freq * np.arange(int(seconds * rate)) / rate)).astype(np.float32)


def test_tones_chords_noise_and_silence_are_never_detected(fake_server):
    """Issue 54: the network scores a plain low tone ~0.99; the verdict needs speech-like signal
    first (audio/speech_evidence.py), so none of these is `detected`."""
    rng = np.random.default_rng(0)
    cases = {"tone_110": _tone(110), "tone_440": _tone(440), "tone_220_marked": embed(load_watermarker(), _tone(220)),
             "chord": (_tone(261.6) + _tone(329.6) + _tone(392.0)) / 3, "silence": np.zeros(24_000 * 5, np.float32),
             "white_noise": (0.1 * rng.standard_normal(24_000 * 5)).astype(np.float32),
             "clipped_tone": np.clip(_tone(150) * 10, -0.5, 0.5)}
    for name, audio in cases.items():
        got = _post(fake_server, _file(audio, "WAV")).json()
        assert got["detected"] is False and got["verdict"] == "inconclusive", (name, got)
        assert got["reason"] == "too_little_speech", (name, got)  # whatever the score (the tone's ~0.99)


def _with_slots(state, slots, held: bool):
    """Swap in `slots` (and, when `held`, a detector that blocks until released); returns the
    (release, entered, undo) of the swap."""
    import threading

    release, entered = threading.Event(), threading.Event()
    original_slots, detector = state.detect_slots, state.detector
    real_detect = detector.detect_file

    def hold(*args):
        entered.set()
        release.wait(30)
        return real_detect(*args)

    state.detect_slots = slots
    if held:
        detector.detect_file = hold

    def undo():
        release.set()
        detector.detect_file = real_detect
        state.detect_slots.shutdown()
        state.detect_slots = original_slots

    return release, entered, undo


def test_a_detection_waits_for_a_busy_slot_instead_of_a_429(fake_server, clips):
    """Issue 61: the one detection slot is busy; the next one waits its turn (no 429) and is
    served once the slot frees."""
    from higgs_serve.server.limits.detect_slots import DetectSlots

    state = fake_server.app.state.server
    slots = DetectSlots(running=1, wait_s=30)
    release, entered, undo = _with_slots(state, slots, held=True)
    try:
        marked, _ = clips
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(_post, fake_server, _file(marked, "WAV"))
            assert entered.wait(30)
            second = pool.submit(_post, fake_server, _file(marked, "WAV"))
            deadline = time.monotonic() + 30
            while slots.in_flight < 2:  # the second is queued behind the held one
                assert time.monotonic() < deadline and not second.done(), second.result().text
                time.sleep(0.01)
            release.set()
            assert first.result().status_code == 200
            assert second.result().status_code == 200 and second.result().json()["verdict"] == "marked"
    finally:
        undo()


def test_a_detection_is_refused_when_its_wait_passes_the_bound(fake_server, clips):
    """Issue 52 and 61: past the wait bound (--detect-wait-s), 429 in OpenAI's shape with
    Retry-After, naming the bound; the slot serves again once free."""
    from higgs_serve.server.limits.detect_slots import DetectSlots

    state = fake_server.app.state.server
    release, entered, undo = _with_slots(state, DetectSlots(running=1, wait_s=0.3), held=True)
    try:
        marked, _ = clips
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(_post, fake_server, _file(marked, "WAV"))
            assert entered.wait(30)
            busy = _post(fake_server, _file(marked, "WAV"))
            release.set()
            assert first.result().status_code == 200
        assert busy.status_code == 429 and int(busy.headers["Retry-After"]) >= 1
        error = busy.json()["error"]
        assert error["type"] == "overloaded_error" and "would wait more than 0.3 s" in error["message"]
        assert _post(fake_server, _file(marked, "WAV")).status_code == 200  # the place is free again
    finally:
        undo()


def test_many_detections_at_once_are_all_served(fake_server):
    """Issue 61's acceptance in small: 64 detections sent at once, 2 running at a time, every one
    answered 200 (before: 8 were taken and the rest answered 429 at once). The real detector on
    a 0.2 s clip; the bound is generous so that a loaded machine cannot fail it."""
    from higgs_serve.server.limits.detect_slots import DetectSlots

    state = fake_server.app.state.server
    _, _, undo = _with_slots(state, DetectSlots(running=2, wait_s=120), held=False)
    try:
        data = _file(speechlike(0.2, 3), "WAV")
        with ThreadPoolExecutor(64) as pool:
            answers = list(pool.map(lambda _: _post(fake_server, data), range(64)))
        assert [a.status_code for a in answers] == [200] * 64, {a.text for a in answers}
    finally:
        undo()


def test_a_missing_file_and_a_body_past_the_limit(fake_server):
    got = httpx.post(f"{fake_server.url}{PATH}", data={"format": "pcm"}, timeout=30)
    assert got.status_code == 400 and got.json()["error"]["param"] == "file"
    got = httpx.post(f"{fake_server.url}{PATH}", files={"file": ("big", b"\0" * (DETECT_MAX_BYTES + 2**20))},
                     timeout=60)
    assert got.status_code == 413 and "error" in got.json()


def test_signed_file_responses(tmp_path):
    """With a signing identity, whole-file responses (single, batch) carry a C2PA manifest the
    reader trusts; formats without a place for one are sent as they were."""
    import base64

    import c2pa
    from fake_engine import FakeEngine
    from live_server import MODEL_NAME, fake_settings, start_threaded_server

    from higgs_serve.preflight import load_provenance
    from support.c2pa_certs import make_chain

    chain = make_chain()
    cert, key = chain.write(tmp_path)
    settings = fake_settings(tmp_path, c2pa_cert=cert, c2pa_key=key)
    live = start_threaded_server(FakeEngine(), settings, provenance=load_provenance(settings))
    try:
        body = {"model": MODEL_NAME, "input": "Hello there.", "stream": False}
        for fmt, mime in (("wav", "audio/wav"), ("mp3", "audio/mpeg"), ("flac", "audio/flac")):
            got = httpx.post(f"{live.url}/v1/audio/speech", json={**body, "response_format": fmt}, timeout=60)
            assert got.status_code == 200, got.text
            with c2pa.Reader(mime, io.BytesIO(got.content), context=chain.trust_context()) as reader:
                assert reader.get_validation_state() == "Trusted", fmt
        pcm = httpx.post(f"{live.url}/v1/audio/speech", json={**body, "response_format": "pcm"}, timeout=60)
        assert pcm.status_code == 200 and b"c2pa" not in pcm.content
        batch = httpx.post(f"{live.url}/v1/audio/speech/batch", timeout=60,
                           json={"model": MODEL_NAME, "items": [{"input": "One."}], "response_format": "wav"})
        assert batch.status_code == 200, batch.text
        item = base64.b64decode(batch.json()["results"][0]["audio_data"])
        with c2pa.Reader("audio/wav", io.BytesIO(item), context=chain.trust_context()) as reader:
            assert reader.get_validation_state() == "Trusted"
    finally:
        live.stop()
