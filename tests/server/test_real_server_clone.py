"""Voice cloning end to end (issue 5): the real server (`higgs_serve.cli serve <tiny model>`, whose
reference encoder is the checkpoint's codec encoder) in a subprocess, driven by the official
openai client and raw httpx.

Covered: `ref_audio` as base64, as a data URI and as an allow-listed URL; `ref_text`; a registered
voice (upload, list, use, delete); the encode cache (read from /metrics); every bad reference as
a 400 in the OpenAI error shape. One server for the module and 20-frame utterances, so the
module costs about the server's start-up time.
"""

from __future__ import annotations

import base64
import io
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from bad_requests import post_bad_request
from live_server import Subprocess, metric, serve_subprocess

from higgs_serve.metrics import ServerMetrics

NAME = "higgs-tiny-clone"
RATE = 24000
FRAMES = 20  # every good request asks for exactly this many frames (min = max)
PCM_BYTES = FRAMES * 960 * 2  # 960 samples of s16le per 40 ms frame
TEXT = "Hello there."
FIXED = {"max_new_tokens": FRAMES, "min_new_tokens": FRAMES}
ALLOWED_HOST = "127.0.0.1"  # the test's own clip server; every other host is refused


# ----------------------------------------------------------------------------- reference clips
def _wav_bytes(audio: np.ndarray, rate: int = RATE) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, audio, rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def _sines(seconds: float, freqs_hz: tuple[float, ...], rate: int = RATE) -> np.ndarray:
    """A mix of sines with 20 ms fades: [n] float32 in [-0.5, 0.5]."""
    t = np.arange(int(seconds * rate)) / rate
    audio = sum(np.sin(2 * np.pi * f * t) for f in freqs_hz) * (0.5 / len(freqs_hz))
    fade = np.minimum(1.0, np.minimum(t, t[-1] - t) / 0.02)
    return (audio * fade).astype(np.float32)


CLIP_A = _wav_bytes(_sines(1.2, (220.0, 330.0, 1250.0)))
CLIP_B = _wav_bytes(_sines(1.2, (140.0, 610.0, 2900.0)))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _data_uri(data: bytes) -> str:
    return "data:audio/wav;base64," + _b64(data)


# ----------------------------------------------------------------------------- fixtures
class _ClipHandler(BaseHTTPRequestHandler):
    """Serves CLIP_A at any path: the allow-listed `ref_audio` URL."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self.send_response(200)
        self.send_header("Content-Type", "audio/wav")
        self.send_header("Content-Length", str(len(CLIP_A)))
        self.end_headers()
        self.wfile.write(CLIP_A)

    def log_message(self, *_args) -> None:  # keep pytest output clean
        pass


@pytest.fixture(scope="module")
def clip_url() -> Iterator[str]:
    server = ThreadingHTTPServer((ALLOWED_HOST, 0), _ClipHandler)
    thread = threading.Thread(target=server.serve_forever, name="clip-server", daemon=True)
    thread.start()
    try:
        yield f"http://{ALLOWED_HOST}:{server.server_address[1]}/clip.wav"
    finally:
        server.shutdown()
        thread.join(timeout=5)


@pytest.fixture(scope="module")
def clone_server(tiny_model_dir, tmp_path_factory, clip_url) -> Iterator[Subprocess]:
    work = tmp_path_factory.mktemp("clone_server")
    allowed = clip_url.split("/")[2]  # 127.0.0.1:<port>: a loopback address, listed with its port
    # the default profile (the deadline policy off): the first chunk is the profile's, tests
    # compare a seed's audio
    overrides = json.dumps({"0": {"compilation_config": {"cudagraph_capture_sizes": [1, 2]}}})
    with serve_subprocess(tiny_model_dir, work, [
        "--served-model-name", NAME, "--max-num-seqs", "2", "--max-queue", "2",
        "--voices-dir", str(work / "voices"), "--allowed-ref-audio-domains", allowed,
        "--stage-overrides", overrides,
    ]) as server:
        yield server


@pytest.fixture(scope="module")
def voices_dir(clone_server) -> Path:
    return Path(clone_server.log_path).parent / "voices"  # the server's --voices-dir


@pytest.fixture(scope="module")
def http(clone_server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=clone_server.url, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def oai(clone_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{clone_server.url}/v1", api_key="unused", max_retries=0,
                         timeout=30)


# ----------------------------------------------------------------------------- helpers
def _encoder_counts(http: httpx.Client) -> tuple[float, float]:
    """(encoder runs, cache hits) of the server's reference encoder."""
    return (metric(http, "higgs_serve_reference_encodes_total"),
            metric(http, "higgs_serve_reference_cache_hits_total"))


def _speak(http: httpx.Client, seed: int, **fields) -> bytes:
    """One 20-frame utterance as raw s16le PCM; asserts 200 and the exact length."""
    response = http.post("/v1/audio/speech", json={
        "model": NAME, "input": TEXT, "seed": seed, "response_format": "pcm", **FIXED, **fields})
    assert response.status_code == 200, response.text
    assert response.headers["x-sample-rate"] == str(RATE)
    assert len(response.content) == PCM_BYTES
    return response.content


def _register(http: httpx.Client, name: str, clip: bytes, ref_text: str | None) -> dict:
    data = {"name": name, **({"ref_text": ref_text} if ref_text is not None else {})}
    response = http.post("/v1/audio/voices", data=data,
                         files={"audio_sample": (f"{name}.wav", clip, "audio/wav")})
    assert response.status_code == 200, response.text
    return response.json()


def _error(response: httpx.Response, param: str) -> str:
    """Asserts a 400 in the OpenAI error shape naming `param`; returns the message."""
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param
    return error["message"]


# ----------------------------------------------------------------------------- tests
def test_ref_audio_base64_then_data_uri_is_one_encode_and_one_cache_hit(oai, http):
    encodes, hits = _encoder_counts(http)
    response = oai.audio.speech.create(
        model=NAME, input=TEXT, voice="default", response_format="wav",
        extra_body={"seed": 11, "ref_audio": _b64(CLIP_A), "stream": True, **FIXED})
    assert response.response.headers["x-usage-input-tokens"]  # streamed: no output count
    audio, rate = sf.read(io.BytesIO(response.content), dtype="int16")
    assert rate == RATE and audio.shape == (FRAMES * 960,)
    assert _encoder_counts(http) == (encodes + 1, hits)
    # The same clip as a data URI: same samples, so no second encode, and the same audio.
    again = np.frombuffer(_speak(http, 11, ref_audio=_data_uri(CLIP_A)), "<i2")
    # Same samples: wav and pcm are written from the same int16 conversion (both streamed)
    assert np.array_equal(again, audio)
    assert _encoder_counts(http) == (encodes + 1, hits + 1)
    assert metric(http, "higgs_serve_reference_encode_seconds_total") > 0
    assert metric(http, "higgs_serve_reference_encoded_audio_seconds_total") >= 1.2


def test_the_reference_and_ref_text_change_the_audio_and_the_seed_fixes_it(http):
    clone_a = _speak(http, 21, ref_audio=_b64(CLIP_A))
    assert _speak(http, 21, ref_audio=_b64(CLIP_A)) == clone_a  # same seed + same reference
    assert _speak(http, 21, ref_audio=_b64(CLIP_B)) != clone_a  # another voice
    assert _speak(http, 21) != clone_a  # zero-shot
    with_text = _speak(http, 21, ref_audio=_b64(CLIP_A), ref_text="A short test tone.")
    assert with_text != clone_a  # the transcript is part of the prompt
    assert _speak(http, 21, ref_audio=_b64(CLIP_A), ref_text="A short test tone.") == with_text


def test_allow_listed_url_is_fetched_and_hits_the_cache(http, clip_url):
    expected = _speak(http, 31, ref_audio=_b64(CLIP_A))
    encodes, hits = _encoder_counts(http)
    assert _speak(http, 31, ref_audio=clip_url) == expected
    assert _encoder_counts(http) == (encodes, hits + 1)


def test_registered_voice_upload_list_use_delete(http, voices_dir):
    created = _register(http, "narrator", CLIP_A, "A short test tone.")
    assert created["object"] == "voice" and created["duration_s"] == pytest.approx(1.2)
    assert created["sample_rate_hz"] == RATE and created["ref_text"] == "A short test tone."
    listed = http.get("/v1/audio/voices").json()
    assert [v["name"] for v in listed["data"]] == ["narrator"]
    assert (voices_dir / "narrator" / "audio.wav").exists()  # persisted under --voices-dir

    first = _speak(http, 41, voice="narrator")
    assert (voices_dir / "narrator" / "codes.npy").exists()  # encoded once, cached on disk
    encodes, hits = _encoder_counts(http)
    assert _speak(http, 41, voice="narrator") == first  # from the cached codes: no encoder call
    assert _encoder_counts(http) == (encodes, hits)
    assert _speak(http, 42, voice="narrator") != first
    assert _speak(http, 41, voice="narrator") != _speak(http, 41)  # cloned, not zero-shot

    deleted = http.delete("/v1/audio/voices/narrator")
    assert deleted.json() == {"object": "voice.deleted", "name": "narrator", "deleted": True}
    assert http.get("/v1/audio/voices").json()["data"] == []
    assert not (voices_dir / "narrator").exists()
    gone = http.post("/v1/audio/speech", json={"input": TEXT, "voice": "narrator", **FIXED})
    assert "'narrator'" in _error(gone, "voice")


def test_registered_voice_works_through_the_openai_client(oai, http):
    _register(http, "speaker-b", CLIP_B, None)
    try:
        response = oai.audio.speech.create(model=NAME, input=TEXT, voice="speaker-b",
                                           response_format="pcm", extra_body={"seed": 51, **FIXED})
        assert response.content == _speak(http, 51, ref_audio=_b64(CLIP_B))  # same clip, same voice
    finally:
        assert http.delete("/v1/audio/voices/speaker-b").status_code == 200


def _bad_reference_cases(clip_url: str) -> list[tuple[str, dict, str, str]]:
    """(case, body, param, a phrase the message must contain)."""
    too_short = _wav_bytes(_sines(0.4, (440.0,)))  # under the 0.5 s minimum
    too_long = _wav_bytes(_sines(31.0, (440.0,), rate=8000), rate=8000)  # small file, resampled
    return [
        ("unreadable audio", {"ref_audio": _b64(b"RIFF....definitely not audio")}, "ref_audio",
         "not a supported audio file"),
        ("unreadable audio data uri", {"ref_audio": _data_uri(b"\x00" * 64)}, "ref_audio",
         "not a supported audio file"),
        ("too short", {"ref_audio": _b64(too_short)}, "ref_audio", "0.40 s"),
        ("too long", {"ref_audio": _data_uri(too_long)}, "ref_audio", "31.00 s"),
        ("voice plus ref_audio", {"voice": "taken", "ref_audio": _b64(CLIP_A)}, "ref_audio",
         "not both"),
        ("ref_text without ref_audio", {"ref_text": "words"}, "ref_text", "needs ref_audio"),
        ("ref_text with a voice", {"voice": "taken", "ref_text": "words"}, "ref_text",
         "needs ref_audio"),
        ("url host not allow-listed",
         {"ref_audio": clip_url.replace(ALLOWED_HOST, "localhost")}, "ref_audio", "'localhost'"),
        ("other host", {"ref_audio": "https://example.com/a.wav"}, "ref_audio", "'example.com'"),
        ("file url", {"ref_audio": "file:///etc/passwd"}, "ref_audio", "base64"),
    ]


def test_every_bad_reference_is_a_400_in_the_openai_shape(oai, http, clip_url):
    _register(http, "taken", CLIP_B, None)
    try:
        encodes = _encoder_counts(http)[0]
        for case, fields, param, phrase in _bad_reference_cases(clip_url):
            body = {"model": NAME, "input": TEXT, **FIXED, **fields}
            try:
                post_bad_request(http, body, 400, param)
                message = http.post("/v1/audio/speech", json=body).json()["error"]["message"]
                assert phrase in message, message
            except AssertionError as error:
                raise AssertionError(f"case {case!r}: {error}") from error
        assert _encoder_counts(http)[0] == encodes  # nothing bad reached the encoder
        # The official client sees the same error as a BadRequestError.
        with pytest.raises(openai.BadRequestError) as raised:
            oai.audio.speech.create(model=NAME, input=TEXT, voice="taken",
                                    extra_body={"ref_audio": _b64(CLIP_A)})
        assert raised.value.status_code == 400
        assert raised.value.body["param"] == "ref_audio"
    finally:
        assert http.delete("/v1/audio/voices/taken").status_code == 200
    assert http.get("/health").status_code == 200
    _speak(http, 61, ref_audio=_b64(CLIP_A))  # the engine still clones


def test_bad_voice_uploads_are_400s_naming_audio_sample(http):
    for clip in (b"not audio", _wav_bytes(_sines(0.3, (440.0,)))):
        response = http.post("/v1/audio/voices", data={"name": "bad"},
                             files={"audio_sample": ("bad.wav", clip, "audio/wav")})
        _error(response, "audio_sample")
    assert http.get("/v1/audio/voices").json()["data"] == []


def test_metrics_export_only_the_counters_a_plain_hook_has():
    """The server's hook may be any callable (tests pass functions): no counters, no crash."""
    def plain_hook(audio):
        return np.zeros((1, 8), np.int64)

    plain_hook.cache_hits = 3  # only this one of the encoder's counters
    text = ServerMetrics(dict, lambda: 0, reference_encoder=plain_hook).render().decode()
    assert "higgs_serve_reference_cache_hits_total 3.0" in text
    assert "reference_encodes" not in text and "reference_encode_seconds" not in text
    assert "reference_" not in ServerMetrics(dict, lambda: 0).render().decode()
