"""Every endpoint's audio carries the watermark when the switch is on (issue 43), and none when it
is off: the real server (`higgs-serve serve` on the tiny model, CPU) in a subprocess, the mark on
by default and C2PA signing on (a throwaway chain), one request per endpoint and way of
answering, each output handed to the server's own detector (POST /v1/audio/watermark/detect) in
the format it came in. Whole files in wav/mp3/flac also carry a manifest c2pa's reader trusts;
streams and unsigned files carry the claim header instead.

Elsewhere: `synth` (tests/engine/test_watermark_cli.py), the front end
(tests/cluster/test_frontend_watermark.py), the engine's chunks (tests/engine/test_watermark_engine.py).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json

import c2pa
import httpx
import pytest
import websockets
from live_server import serve_subprocess
from support.c2pa_certs import make_chain

from higgs_serve.audio.provenance import CLAIM_HEADER, SIGNABLE_FORMATS, TRAINED_ALGORITHMIC_MEDIA

FRAMES = 50  # 2 s a request: the tiny model's audio scores ~1.0 marked, < 0.02 unmarked
FIXED = {"max_new_tokens": FRAMES, "min_new_tokens": FRAMES}
TEXT = "Hello there, how are you today?"
SEGMENT_MAX_CHARS = 40  # LONG_TEXT: two segments
LONG_TEXT = "The first sentence is said here. And then the second one follows."


@pytest.fixture(scope="module")
def chain():
    return make_chain()


@pytest.fixture(scope="module")
def marked(tiny_model_dir, tmp_path_factory, chain):
    """A server with the mark on (the default) that signs files."""
    work = tmp_path_factory.mktemp("marked")
    cert, key = chain.write(work)
    with serve_subprocess(tiny_model_dir, work, [
            "--max-num-seqs", "2", "--segment-max-chars", str(SEGMENT_MAX_CHARS),
            "--c2pa-cert", str(cert), "--c2pa-key", str(key)]) as server:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            yield server, http


def _detect(http: httpx.Client, data: bytes, **headerless) -> dict:
    answer = http.post("/v1/audio/watermark/detect", files={"file": ("audio", data)},
                       data={k: str(v) for k, v in headerless.items()})
    assert answer.status_code == 200, answer.text
    return answer.json()


def _assert_marked(http: httpx.Client, data: bytes, **headerless) -> None:
    """The network finds the mark; the tiny model's audio is not speech, so the verdict is
    `inconclusive`, never `not_marked` (audio/watermark_detect.py)."""
    found = _detect(http, data, **headerless)
    assert found["score"] >= 0.9 and found["verdict"] in ("marked", "inconclusive"), found


def _speech(http: httpx.Client, **fields) -> httpx.Response:
    answer = http.post("/v1/audio/speech", json={"input": TEXT, "seed": 5, **FIXED, **fields})
    assert answer.status_code == 200, answer.text
    return answer


def _assert_trusted_manifest(data: bytes, response_format: str, chain) -> None:
    with c2pa.Reader(SIGNABLE_FORMATS[response_format], io.BytesIO(data),
                     context=chain.trust_context()) as reader:
        assert reader.get_validation_state() == "Trusted"
        manifest = reader.get_active_manifest()
    (actions,) = [a["data"]["actions"] for a in manifest["assertions"] if a["label"].startswith("c2pa.actions")]
    assert actions[0]["digitalSourceType"] == TRAINED_ALGORITHMIC_MEDIA


def test_rest_file_is_marked_and_signed(marked, chain):
    _, http = marked
    answer = _speech(http, response_format="wav", stream=False)
    assert CLAIM_HEADER.lower() not in answer.headers  # the manifest is in the file
    assert int(answer.headers["content-length"]) == len(answer.content)
    _assert_trusted_manifest(answer.content, "wav", chain)
    _assert_marked(http, answer.content)


def test_rest_stream_without_the_stream_field_is_marked(marked):
    _, http = marked
    answer = _speech(http, response_format="mp3")
    assert "content-length" not in answer.headers  # streamed (no `stream`: the streaming rule)
    assert json.loads(answer.headers[CLAIM_HEADER])["digitalSourceType"] == TRAINED_ALGORITHMIC_MEDIA
    _assert_marked(http, answer.content)


def test_raw_stream_is_marked(marked):
    _, http = marked
    answer = _speech(http, response_format="pcm", stream=True)
    assert CLAIM_HEADER.lower() in answer.headers
    _assert_marked(http, answer.content, format="pcm", sample_rate=24000)


def test_sse_is_marked(marked):
    _, http = marked
    answer = _speech(http, response_format="opus", stream_format="sse")
    assert CLAIM_HEADER.lower() in answer.headers
    events = [json.loads(line[len("data: "):]) for line in answer.text.splitlines() if line.startswith("data: ")]
    audio = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    assert events[-1]["type"] == "speech.audio.done"
    _assert_marked(http, audio)  # the deltas joined: one Ogg Opus stream


def test_websocket_is_marked(marked):
    server, http = marked

    async def session() -> tuple[str | None, bytes]:
        url = server.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
        async with websockets.connect(url) as ws:
            claim = ws.response.headers.get(CLAIM_HEADER)
            await ws.send(json.dumps({"type": "session.config", "response_format": "pcm", "seed": 5, **FIXED}))
            await ws.send(json.dumps({"type": "input.text", "text": TEXT}))
            await ws.send(json.dumps({"type": "session.close"}))
            audio = b""
            async for message in ws:
                if isinstance(message, bytes):
                    audio += message
            return claim, audio

    claim, audio = asyncio.run(session())
    assert claim is not None and json.loads(claim)["action"] == "c2pa.created"
    assert len(audio) == FRAMES * 960 * 2
    _assert_marked(http, audio, format="pcm")


def test_long_form_file_is_marked_and_signed(marked, chain):
    _, http = marked
    answer = _speech(http, input=LONG_TEXT, response_format="flac", stream=False)
    assert answer.headers["x-segment-count"] == "2" and CLAIM_HEADER.lower() not in answer.headers
    _assert_trusted_manifest(answer.content, "flac", chain)
    _assert_marked(http, answer.content)


def test_batch_items_are_marked_and_signed_where_they_can_be(marked, chain):
    _, http = marked
    answer = http.post("/v1/audio/speech/batch", json={"seed": 5, **FIXED, "items": [
        {"input": TEXT, "response_format": "wav"}, {"input": TEXT, "response_format": "ulaw"}]})
    assert answer.status_code == 200, answer.text
    wav, ulaw = (base64.b64decode(item["audio_data"]) for item in answer.json()["results"])
    assert CLAIM_HEADER.lower() in answer.headers  # the ulaw item has no place for a manifest
    _assert_trusted_manifest(wav, "wav", chain)
    _assert_marked(http, wav)
    _assert_marked(http, ulaw, format="ulaw", sample_rate=8000)


def test_with_the_switch_off_the_audio_is_unmarked(tiny_model_dir, tmp_path):
    with serve_subprocess(tiny_model_dir, tmp_path, ["--max-num-seqs", "1", "--watermark", "off"]) as server:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            answer = _speech(http, response_format="wav", stream=False)
            assert CLAIM_HEADER.lower() not in answer.headers  # and nothing signs
            found = _detect(http, answer.content)
    assert found["detected"] is False and found["score"] < 0.1, found
    log = open(server.log_path).read()
    assert log.count("watermark off: generated audio is not marked") == 1
