"""Drop-in for peers' clients, part 2 (issue 29, points 8 and 9), against the same real server as
test_peer_compat.py: the voices API as vllm-omni's upload/list clients use it, and
POST /v1/audio/speech/batch in vllm-omni's shape."""

from __future__ import annotations

import base64
import io

import httpx
import pytest
import soundfile as sf
from live_server import metric
from peer_server import CLIP, FIXED, FRAMES, RATE, REF_TEXT, clip_b64, speak


@pytest.fixture(scope="module")
def http(peer_server):
    with httpx.Client(base_url=peer_server.server.url, timeout=120) as client:
        yield client


def _wav(seconds: float) -> bytes:
    audio, rate = sf.read(io.BytesIO(CLIP), dtype="float32")
    buffer = io.BytesIO()
    sf.write(buffer, audio[: int(seconds * rate)], rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def _upload(http, name: str, clip: bytes, **form) -> httpx.Response:
    return http.post("/v1/audio/voices", data={"name": name, **form},
                     files={"audio_sample": ("v.wav", clip, "audio/wav")})


# ----------------------------------------------------------------------------- point 8: voices
def test_voice_upload_keeps_consent_and_description_and_lists_peer_shapes(http):
    created = _upload(http, "peer-narrator", CLIP, ref_text=REF_TEXT, consent="consent-123",
                      speaker_description="warm narrator")
    assert created.status_code == 200, created.text
    assert created.json()["replaced"] is False
    listing = http.get("/v1/audio/voices").json()
    (entry,) = [voice for voice in listing["data"] if voice["name"] == "peer-narrator"]
    assert entry["consent"] == "consent-123" and entry["speaker_description"] == "warm narrator"
    assert "peer-narrator" in listing["voices"]
    assert listing["voices"] == [voice["name"] for voice in listing["data"]]
    assert listing["uploaded_voices"] == listing["data"]


def test_voice_reupload_is_409_unless_overwrite(http):
    assert _upload(http, "peer-overwrite", _wav(1.2)).status_code == 200
    again = _upload(http, "peer-overwrite", _wav(0.8))
    assert again.status_code == 409 and "overwrite=true" in again.json()["error"]["message"]
    replaced = _upload(http, "peer-overwrite", _wav(0.8), overwrite="true",
                       speaker_description="second take")
    assert replaced.status_code == 200, replaced.text
    body = replaced.json()
    assert body["replaced"] is True and body["duration_s"] == 0.8
    (entry,) = [v for v in http.get("/v1/audio/voices").json()["data"]
                if v["name"] == "peer-overwrite"]
    assert entry["duration_s"] == 0.8 and entry["speaker_description"] == "second take"


def test_voice_as_object_and_speaker_alias_name_the_same_voice(http):
    assert _upload(http, "peer-alias", CLIP, ref_text=REF_TEXT).status_code == 200
    forms = [{"voice": "peer-alias"}, {"voice": {"id": "peer-alias"}}, {"speaker": "peer-alias"},
             {"speaker": "peer-alias", "voice": "peer-alias"}]
    outputs = {speak(http, **form, seed=13, response_format="pcm", **FIXED).content
               for form in forms}
    zero_shot = speak(http, seed=13, response_format="pcm", **FIXED).content
    assert len(outputs) == 1 and zero_shot not in outputs


# ----------------------------------------------------------------------------- point 9: batch
def _decoded(result: dict) -> tuple:
    return sf.read(io.BytesIO(base64.b64decode(result["audio_data"])), dtype="int16")


def test_batch_in_vllm_shape_with_defaults_overrides_and_a_bad_item(http):
    response = http.post("/v1/audio/speech/batch", json={
        "items": [{"input": "Hello, how are you?"},
                  {"input": "Goodbye, see you later!", "response_format": "flac", "seed": 2},
                  {"input": "   "},
                  {"input": "Unknown voice.", "voice": "nobody"},
                  {"input": "Fourth item.", "sample_rate": 16000}],
        "voice": None, "language": "English", "task_type": "Base", "response_format": "wav",
        "seed": 1, **FIXED})
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["total"], body["succeeded"], body["failed"]) == (5, 3, 2)
    results = body["results"]
    assert [result["index"] for result in results] == [0, 1, 2, 3, 4]
    assert [result["status"] for result in results] == ["success", "success", "error", "error",
                                                        "success"]
    assert results[2]["param"] == "input" and results[2]["status_code"] == 400
    assert results[3]["param"] == "voice" and "nobody" in results[3]["error"]
    assert (results[0]["media_type"], results[1]["media_type"]) == ("audio/wav", "audio/flac")
    for result, rate in ((results[0], RATE), (results[1], RATE), (results[4], 16000)):
        audio, file_rate = _decoded(result)
        assert file_rate == rate == result["sample_rate"] and len(audio) == FRAMES * rate // 25
        usage = result["usage"]
        assert usage["output_tokens"] == FRAMES
        assert usage["total_tokens"] == usage["input_tokens"] + FRAMES
    single = speak(http, input="Hello, how are you?", seed=1, **FIXED)
    assert base64.b64decode(results[0]["audio_data"]) == single.content


def _engine_counts(http) -> tuple[float, float]:
    return (metric(http, "higgs_serve_stage0_rows_total"),
            metric(http, "higgs_serve_stage0_step_seconds_count"))


def test_batch_level_reference_clones_every_item_concurrently(http):
    rows_before, steps_before = _engine_counts(http)
    response = http.post("/v1/audio/speech/batch", json={
        "items": [{"input": "First sentence."}, {"input": "Second sentence."},
                  {"input": "Third sentence."}, {"input": "Fourth sentence."}],
        "ref_audio": clip_b64(), "ref_text": REF_TEXT, "response_format": "pcm", "seed": 4,
        **FIXED})
    body = response.json()
    assert body["succeeded"] == 4, body
    rows_after, steps_after = _engine_counts(http)
    # items share engine steps (max_num_seqs 2): more than one row sampled per step on average
    assert (rows_after - rows_before) / (steps_after - steps_before) > 1.5
    single = speak(http, input="Third sentence.", ref_audio=clip_b64(), ref_text=REF_TEXT,
                   response_format="pcm", seed=4, **FIXED)
    assert base64.b64decode(body["results"][2]["audio_data"]) == single.content


@pytest.mark.parametrize("body, status, words", [
    ({"items": []}, 400, "items"),
    ({"items": [{"input": "x"}] * 33}, 400, "items"),
    ({"items": [{"input": "x"}], "stream": True}, 400, "stream"),
    ({"items": [{"input": "x"}], "speed": 9.0}, 400, "speed"),
])
def test_malformed_batches_are_400(http, body, status, words):
    response = http.post("/v1/audio/speech/batch", json=body)
    assert response.status_code == status and words in response.json()["error"]["message"]


def test_streaming_items_are_per_item_errors(http):
    body = http.post("/v1/audio/speech/batch", json={
        "items": [{"input": "x", "stream": True}, {"input": "y", **FIXED}]}).json()
    assert [r["status"] for r in body["results"]] == ["error", "success"]
    assert body["results"][0]["param"] == "stream"


def test_a_long_batch_item_is_what_speech_gives_the_same_input(http):
    """Issue 40 item 8: a 900-character input with seed 3 was several segments through /speech but one
    capped request as a batch item. An item is now planned and spoken exactly as /speech with
    stream false speaks it: long-form, the same segments, seeds and audio."""
    text = " ".join(f"This is sentence number {i} of a longer text." for i in range(20))
    assert 880 <= len(text) <= 960
    single = speak(http, input=text, seed=3, response_format="wav", stream=False, **FIXED)
    segments = int(single.headers["x-segment-count"])
    assert single.status_code == 200 and segments >= 3
    batch = http.post("/v1/audio/speech/batch", json={
        "items": [{"input": text, "seed": 3}, {"input": "Short one.", "seed": 3}],
        "response_format": "wav", **FIXED}).json()
    long_item, short_item = batch["results"]
    assert long_item["status"] == "success", long_item
    assert base64.b64decode(long_item["audio_data"]) == single.content
    assert long_item["usage"]["output_tokens"] == int(single.headers["x-usage-output-tokens"])
    assert long_item["usage"]["output_tokens"] == segments * FRAMES
    assert short_item["usage"]["output_tokens"] == FRAMES
