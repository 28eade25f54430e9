"""POST /v1/audio/watermark/detect on a real uvicorn server: files in the formats the server reads
and headerless samples, the answer's shape, and every refusal in OpenAI's error shape (the API
key on it is checked with every /v1 route in test_auth_and_urls.py)."""

from __future__ import annotations

import io

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
        assert set(got.json()) == {"detected", "score"}
        assert got.json()["detected"] is True and got.json()["score"] >= THRESHOLD, fmt
        got = _post(fake_server, _file(plain, fmt)).json()
        assert got["detected"] is False and got["score"] < THRESHOLD, fmt
    assert _post(fake_server, av_encode(marked, 24_000, "aac", "adts", bit_rate=64_000)).json()["detected"]


def test_headerless_samples(fake_server, clips):
    marked, _ = clips
    pcm = (np.clip(marked, -1, 1) * 32767).astype("<i2").tobytes()
    assert _post(fake_server, pcm, format="pcm").json()["detected"] is True
    ulaw = av_encode(marked, 24_000, "pcm_mulaw", "mulaw", out_rate_hz=8000)
    assert _post(fake_server, ulaw, format="ulaw", sample_rate=8000).json()["detected"] is True
    # the wrong rate for the same bytes: read as 3x faster speech, not the mark's band any more
    assert _post(fake_server, ulaw, format="ulaw", sample_rate=24000).json()["detected"] is False


@pytest.mark.parametrize("case", ["junk", "empty", "unknown_field", "rate_without_format", "bad_format", "too_long"])
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
    }[case]
    got = _post(fake_server, data, **fields)
    assert got.status_code == 400, got.text
    error = got.json()["error"]
    assert error["param"] == param and words in error["message"] and error["type"] == "invalid_request_error"


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
