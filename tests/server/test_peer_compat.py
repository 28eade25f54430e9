"""Drop-in for vllm-omni and sglang-omni clients (issue 29), against the real server.

The real server (`higgs_serve.cli serve <tiny model>`, uvicorn in a subprocess, the checkpoint's
codec encoder for cloning) replays the request shapes the peers' published clients send, written
here from their docs: vllm-omni's Higgs e2e test (the official openai client, `voice=None`, extras
in `extra_body`), sglang-omni's Higgs cookbook and Seed-TTS benchmark (JSON bodies with
`references` naming local files, raw PCM streaming, usage headers), and every new field with a
test of its effect. Batch and voices live in test_peer_compat_batch.py (same server).
"""

from __future__ import annotations

import base64
import io
import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from peer_server import FIXED, HUB_ID, NAME, RATE, REF_TEXT, clip_b64, frames_of, speak

TEXT = "Hello world."


@pytest.fixture(scope="module")
def http(peer_server):
    with httpx.Client(base_url=peer_server.server.url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def oai(peer_server):
    return openai.OpenAI(base_url=f"{peer_server.server.url}/v1", api_key="unused",
                         max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def media_dir(peer_server):
    return peer_server.media_dir


@pytest.fixture(scope="module")
def clip_codes(peer_server):
    return peer_server.clip_codes


@pytest.fixture(scope="module")
def clip_data_uri():
    return "data:audio/wav;base64," + clip_b64()


def _pcm_frames(data: bytes, rate: int = RATE) -> float:
    return len(data) / 2 / (rate // 25)


# ----------------------------------------------------------------------------- vllm-omni e2e
@pytest.mark.parametrize("extra_body", [None, {"max_new_tokens": 32, "seed": 5}])
def test_vllm_e2e_zero_shot_wav_with_voice_null(oai, extra_body):
    """Their helper: audio.speech.create(model, input, response_format, extra_body or None,
    voice=None): the plain-text case exactly, and the max_new_tokens case."""
    response = oai.audio.speech.with_raw_response.create(
        model=HUB_ID, input=TEXT, response_format="wav", voice=None, extra_body=extra_body)
    audio, rate = sf.read(io.BytesIO(response.content), dtype="int16")
    # no `stream`, in wav: the file, whose header states its length (docs/api.md#streaming)
    assert int(response.headers["content-length"]) == len(response.content)
    assert rate == RATE and len(audio) % 960 == 0 and len(audio) > 0


def test_vllm_e2e_pcm_streaming_three_at_once(oai, http):
    """Their concurrent streaming case (stream_format 'audio' in extra_body, iter_bytes,
    request_num=3), with max_new_tokens (which their helper forwards) to keep it short."""
    text = "She sells seashells by the seashore."

    def one(_) -> tuple[bytes, str]:
        with oai.audio.speech.with_streaming_response.create(
                model=HUB_ID, input=text, response_format="pcm", voice=None,
                extra_body={"stream_format": "audio", "max_new_tokens": 30, "seed": 9}
        ) as response:
            return b"".join(response.iter_bytes()), response.headers["content-type"]

    with ThreadPoolExecutor(max_workers=3) as pool:
        streams = list(pool.map(one, range(3)))
    file = speak(http, input=text, response_format="pcm", max_new_tokens=30, seed=9)
    for data, content_type in streams:
        assert content_type == "audio/pcm" and len(data) == len(file.content) > 0


@pytest.mark.parametrize("shape", ["ref_audio", "references"])
def test_vllm_e2e_voice_clone(oai, clip_data_uri, shape):
    """ref_audio + ref_text as a data URL, and the references[] alias with audio_path = data URL."""
    extra = ({"ref_audio": clip_data_uri, "ref_text": REF_TEXT} if shape == "ref_audio" else
             {"references": [{"audio_path": clip_data_uri, "text": REF_TEXT}]})
    response = oai.audio.speech.with_raw_response.create(
        model=HUB_ID, input=TEXT, response_format="wav", voice=None,
        extra_body={**extra, **FIXED, "seed": 1})
    audio, rate = sf.read(io.BytesIO(response.content), dtype="int16")
    assert rate == RATE and len(audio) == FIXED["max_new_tokens"] * 960


def test_vllm_seed_tts_row_with_task_type_and_language(http, clip_data_uri):
    """vLLM's seed-tts clone rows: task_type 'Base', language 'English'."""
    response = speak(http, ref_audio=clip_data_uri, ref_text=REF_TEXT, task_type="Base",
                     language="English", **FIXED)
    assert response.headers["x-language"] == "English"


# ----------------------------------------------------------------------------- sglang-omni
def test_sglang_cookbook_clone_references_with_local_path(http, media_dir):
    """Cookbook body: voice 'default', references[{audio_path: local file, text}], sampling."""
    response = http.post("/v1/audio/speech", json={
        "model": HUB_ID, "voice": "default", "input": "Have a nice day.",
        "references": [{"audio_path": str(media_dir / "clip.wav"), "text": REF_TEXT}],
        "temperature": 0.8, "top_k": 50, "max_new_tokens": 24, "seed": 2})
    assert response.status_code == 200, response.text
    audio, rate = sf.read(io.BytesIO(response.content), dtype="int16")  # a streamed WAV
    assert rate == RATE and 0 < len(audio) <= 24 * 960 and len(audio) % 960 == 0


@pytest.mark.parametrize("ref_format", ["references", "flat"])
def test_sglang_benchmark_non_stream(http, media_dir, ref_format):
    """benchmark_tts_seedtts: wav, the reference as references[] or flat ref_audio (a local
    path), max_new_tokens 2048; it reads X-Prompt-Tokens / X-Completion-Tokens / X-Engine-Time.
    Its body has no `stream`, which streams here (OpenAI's rule): X-Prompt-Tokens comes with
    the stream, the counts only the end knows come with `stream: false` (docs/api.md)."""
    path = str(media_dir / "clip.wav")
    reference = ({"references": [{"audio_path": path, "text": REF_TEXT}]}
                 if ref_format == "references" else {"ref_audio": path, "ref_text": REF_TEXT})
    body = {"model": HUB_ID, "input": "Get the trust fund to the bank early.",
            "response_format": "wav", **reference, "max_new_tokens": 2048, "seed": 4}
    streamed = http.post("/v1/audio/speech", json=body)
    assert streamed.status_code == 200, streamed.text
    assert int(streamed.headers["x-prompt-tokens"]) > 0
    response = http.post("/v1/audio/speech", json={**body, "stream": False})
    assert response.status_code == 200, response.text
    headers = response.headers
    assert int(headers["x-prompt-tokens"]) == int(headers["x-usage-input-tokens"]) > 0
    assert int(headers["x-completion-tokens"]) == frames_of(headers) > 0
    assert float(headers["x-engine-time"]) > 0
    audio, rate = sf.read(io.BytesIO(response.content), dtype="int16")
    assert rate == RATE and len(audio) == frames_of(headers) * 960


def test_sglang_benchmark_raw_pcm_stream(http, media_dir):
    """stream: true + pcm + initial_codec_chunk_frames 20 (its Higgs default); it reads
    x-sample-rate/channels/bit-depth. Same length as the file answer for the same seed."""
    body = {"model": HUB_ID, "input": TEXT, "response_format": "pcm",
            "references": [{"audio_path": str(media_dir / "clip.wav"), "text": REF_TEXT}],
            "max_new_tokens": 2048, "seed": 3}
    with http.stream("POST", "/v1/audio/speech",
                     json={**body, "stream": True, "initial_codec_chunk_frames": 20}) as response:
        assert response.status_code == 200
        data = b"".join(response.iter_bytes())
        assert response.headers["content-type"] == "audio/pcm"
        assert (response.headers["x-sample-rate"], response.headers["x-channels"],
                response.headers["x-bit-depth"]) == (str(RATE), "1", "16")
    file = speak(http, **body)
    assert _pcm_frames(data) == frames_of(file.headers) > 0


# ----------------------------------------------------------------------------- point 1: nulls
def test_null_means_not_given(http):
    nulls = {key: None for key in ("model", "voice", "speaker", "speed", "response_format",
                                   "stream", "stream_format", "temperature", "top_p", "top_k",
                                   "sample_rate", "language", "task_type", "ref_audio",
                                   "references", "reference_codes", "instructions",
                                   "x_vector_only_mode", "speaker_embedding")}
    with_nulls = speak(http, **nulls, seed=6, **FIXED)  # stream: null = not given: streamed
    plain = speak(http, seed=6, stream=None, **FIXED)
    assert with_nulls.headers["content-type"] == "audio/wav"
    assert with_nulls.content == plain.content


# ----------------------------------------------------------------------------- point 2: references
def test_references_forms_clone_the_same_clip(http, media_dir, clip_data_uri):
    """audio_path (local), ref_audio (data URI), audio (base64), data + media_type: one clip."""
    forms = [{"audio_path": str(media_dir / "clip.wav")}, {"ref_audio": clip_data_uri},
             {"audio": clip_b64()}, {"data": clip_b64(), "media_type": "audio/wav"}]
    outputs = {speak(http, references=[{**form, "text": REF_TEXT}], seed=8,
                     response_format="pcm", **FIXED).content for form in forms}
    flat = speak(http, ref_audio=clip_b64(), ref_text=REF_TEXT, seed=8, response_format="pcm",
                 **FIXED).content
    zero_shot = speak(http, seed=8, response_format="pcm", **FIXED).content
    assert outputs == {flat} and flat != zero_shot


@pytest.mark.parametrize("body, param, words", [
    ({"references": [{"audio": "AAAA"}, {"audio": "AAAA"}]}, "references", "one reference"),
    ({"references": [{"audio_path": "a.wav", "data": "AAAA"}]}, "references.0", "exactly one"),
    ({"references": [{"data": "AAAA", "media_type": "text/plain"}]}, "references.0", "audio/*"),
    ({"voice": "narrator", "speaker": "other"}, "speaker", "alias"),
    ({"reference_text": "words"}, "reference_text", "needs reference_codes"),
])
def test_reference_shape_errors(http, body, param, words):
    response = http.post("/v1/audio/speech", json={"input": TEXT, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"]


# ----------------------------------------------------------------------------- point 3: local files
def test_local_file_url_and_path_are_read_inside_the_allowed_dir(http, media_dir):
    as_url = speak(http, ref_audio=(media_dir / "clip.wav").as_uri(), seed=3, **FIXED)
    as_path = speak(http, ref_audio=str(media_dir / "clip.wav"), seed=3, **FIXED)
    assert as_url.content == as_path.content


@pytest.mark.parametrize("name", ["escape_link.wav", "../outside.wav", "sub/../../outside.wav"])
def test_local_paths_escaping_the_allowed_dir_are_refused(http, media_dir, name):
    for value in (f"{media_dir}/{name}", f"file://{media_dir}/{name}"):
        response = http.post("/v1/audio/speech", json={"input": TEXT, "ref_audio": value})
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["param"] == "ref_audio" and "outside the directory" in error["message"]
    response = http.post("/v1/audio/speech", json={
        "input": TEXT, "references": [{"audio_path": f"{media_dir}/{name}"}]})
    assert response.json()["error"]["param"] == "references[0].audio_path"


def test_local_files_need_the_flag(fake_server):
    """A server started without --allowed-local-media-path names the flag."""
    response = httpx.post(f"{fake_server.url}/v1/audio/speech",
                          json={"input": TEXT, "ref_audio": "file:///etc/passwd"})
    assert response.status_code == 400
    assert "--allowed-local-media-path" in response.json()["error"]["message"]


# ----------------------------------------------------------------------------- point 4: codes
def test_reference_codes_clone_like_the_clip(http, clip_codes):
    """Codes from `encode-voice` of the clip give the same audio as the clip itself."""
    from_codes = speak(http, reference_codes=clip_codes.tolist(), reference_text=REF_TEXT,
                       seed=12, response_format="pcm", **FIXED)
    from_clip = speak(http, ref_audio=clip_b64(), ref_text=REF_TEXT, seed=12,
                      response_format="pcm", **FIXED)
    assert from_codes.content == from_clip.content


@pytest.mark.parametrize("codes, words", [
    ([[1] * 7], "shape [T, 8]"), ([[1024] * 8], "0-1023"), ([[-1] * 8], "0-1023"),
    ([[1] * 8] * 751, "1-750 frames"), ([], "1-750 frames"), ([[True] * 8], "integer"),
])
def test_bad_reference_codes(http, codes, words):
    response = http.post("/v1/audio/speech", json={"input": TEXT, "reference_codes": codes})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"].startswith("reference_codes") and words in error["message"]


# ----------------------------------------------------------------------------- point 5: fields
@pytest.mark.parametrize("rate", [8000, 16000, 22050, 44100, 48000])
def test_sample_rate_resamples_files_and_streams(http, rate):
    wav = speak(http, sample_rate=rate, seed=7, **FIXED)
    audio, file_rate = sf.read(io.BytesIO(wav.content), dtype="int16")
    assert wav.headers["x-sample-rate"] == str(rate) and file_rate == rate
    assert len(audio) == FIXED["max_new_tokens"] * rate // 25
    body = {"input": TEXT, "sample_rate": rate, "response_format": "pcm", "stream": True,
            "seed": 7, **FIXED}
    with http.stream("POST", "/v1/audio/speech", json=body) as response:
        data = b"".join(response.iter_bytes())
        assert response.headers["x-sample-rate"] == str(rate)
    assert _pcm_frames(data, rate) == FIXED["max_new_tokens"]


def test_sample_rate_errors(http):
    # 0 is not "the default" (issue 40 item 9: it was served at 24 kHz)
    for body in ({"sample_rate": 12345}, {"sample_rate": 44100, "response_format": "opus"},
                 {"sample_rate": 0}, {"sample_rate": -8000}):
        response = http.post("/v1/audio/speech", json={"input": TEXT, **body})
        assert response.status_code == 400 and response.json()["error"]["param"] == "sample_rate"


def _first_sse_delta_bytes(http, **fields) -> int:
    body = {"input": TEXT, "response_format": "pcm", "stream_format": "sse", "seed": 1,
            **FIXED, **fields}
    with http.stream("POST", "/v1/audio/speech", json=body) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                if event["type"] == "speech.audio.delta":
                    return len(base64.b64decode(event["audio"]))
    raise AssertionError("no audio delta")


def test_initial_codec_chunk_frames_sets_the_first_chunk(http):
    long = {"max_new_tokens": 40, "min_new_tokens": 40}  # room for a 10-frame first chunk
    assert _first_sse_delta_bytes(http, **long) == 1 * 960 * 2  # the profile's: 1 frame
    assert _first_sse_delta_bytes(http, initial_codec_chunk_frames=10, **long) == 10 * 960 * 2
    assert _first_sse_delta_bytes(http, initial_codec_chunk_frames=0, **long) == 25 * 960 * 2
    for extra, words in (({"initial_codec_chunk_frames": 26, "stream": True}, "codec_chunk_frames"),
                         ({"initial_codec_chunk_frames": 4, "stream": False}, "not streamed"),
                         # wav without stream: true is a file (docs/api.md#streaming)
                         ({"initial_codec_chunk_frames": 4, "response_format": "wav"}, "send stream: true")):
        response = http.post("/v1/audio/speech", json={"input": TEXT, **extra})
        assert response.status_code == 400 and words in response.json()["error"]["message"]


@pytest.mark.parametrize("language, header", [("auto", "auto"), ("English", "English"),
                                              ("zh", "Chinese"), ("en-US", "English")])
def test_language_is_checked_and_echoed(http, language, header):
    assert speak(http, language=language, **FIXED).headers["x-language"] == header


@pytest.mark.parametrize("field, value, param", [
    ("language", "Klingon", "language"), ("task_type", "CustomVoice", "task_type"),
    ("x_vector_only_mode", True, "x_vector_only_mode"),
    ("speaker_embedding", [0.1, 0.2], "speaker_embedding"), ("instructions", "whisper", "instructions"),
])
def test_fields_higgs_cannot_honour_are_refused(http, field, value, param):
    response = http.post("/v1/audio/speech", json={"input": TEXT, field: value})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and (str(value) in error["message"] or param in error["message"])


# ----------------------------------------------------------------------------- points 6 and 7
def test_every_served_name_is_listed_and_accepted(http):
    assert [model["id"] for model in http.get("/v1/models").json()["data"]] == [NAME, HUB_ID]
    for model in (NAME, HUB_ID):
        speak(http, model=model, **FIXED)
    assert http.post("/v1/audio/speech", json={"input": TEXT, "model": "tts-1"}).status_code == 404


def test_same_seed_gives_the_same_samples_in_wav_and_pcm(http):
    pcm = speak(http, response_format="pcm", seed=21, **FIXED).content
    wav = speak(http, response_format="wav", seed=21, **FIXED).content
    samples, _ = sf.read(io.BytesIO(wav), dtype="int16")
    assert samples.astype("<i2").tobytes() == pcm
    flac = speak(http, response_format="flac", seed=21, **FIXED).content
    assert sf.read(io.BytesIO(flac), dtype="int16")[0].astype("<i2").tobytes() == pcm
    assert np.frombuffer(pcm, "<i2").any()
