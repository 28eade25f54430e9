"""The single server's newer endpoints through the data-parallel front end, against the real
tiny-model CPU replicas of conftest.py's `cluster` (no replicas of its own): a WebSocket session
fed text in pieces by the real `websockets` client, a long-form request split at the replicas'
--segment-max-chars, and the batch endpoint (items, per-item errors, routing by the batch's
reference, the replica's 400 passed on)."""

from __future__ import annotations

import base64
import io
import json

import httpx
import pytest
import soundfile as sf
from websockets.exceptions import ConnectionClosedOK
from websockets.sync.client import connect

from support.cluster_e2e import FIXED, FRAMES, PCM_BYTES, SEGMENT_MAX_CHARS, tone_clip

from higgs_serve.cluster.routing import routing_key
from higgs_serve.server.limits.json_limits import MAX_DEPTH, MAX_MEMBERS

SAMPLES = FRAMES * 960
# three sentences, together longer than SEGMENT_MAX_CHARS (not than the default 300)
ARTICLE = ("The river rose slowly through the night, and by morning the lower road was gone. "
           "Farmers moved their animals to the ridge before the rain returned in the afternoon. "
           "By evening the water had started to fall again, leaving mud across every field.")


def _session(url: str, pieces: list[str], seed: int, first: str | None = None) -> list:
    """Every message of one session (text as dicts, audio as bytes), and the close code last;
    `first`: a frame sent before the config (its answer is the first message)."""
    with connect(url.replace("http://", "ws://") + "/v1/audio/speech/stream",
                 max_size=None) as ws:
        if first is not None:
            ws.send(first)
        ws.send(json.dumps({"type": "session.config", "response_format": "pcm", "seed": seed,
                            **FIXED}))
        for piece in pieces:
            ws.send(json.dumps({"type": "input.text", "text": piece}))
        ws.send(json.dumps({"type": "session.close"}))
        messages = []
        while not messages or not isinstance(messages[-1], dict) \
                or messages[-1]["type"] != "session.done":
            message = ws.recv(timeout=60)
            messages.append(message if isinstance(message, bytes) else json.loads(message))
        with pytest.raises(ConnectionClosedOK):  # the replica's close, passed on
            ws.recv(timeout=10)
        return [*messages, ws.close_code]


def test_a_websocket_session_through_the_front_end(cluster):
    url, http, _ = cluster
    messages = _session(url, ["Hello there. How", " are you", " today?"], seed=5)
    assert messages.pop() == 1000  # the replica's normal close reaches the client
    sentences, audio = [], {}
    for message in messages:
        if isinstance(message, bytes):
            audio[sentences[-1]["sentence_index"]] += message
        elif message["type"] == "audio.start":
            sentences.append(message)
            audio[message["sentence_index"]] = b""
        elif message["type"] == "audio.done":
            assert message["total_bytes"] == len(audio[message["sentence_index"]]) == PCM_BYTES
        else:
            assert message["type"] == "session.done", message
    assert [s["sentence_text"].strip() for s in sentences] == ["Hello there.", "How are you today?"]
    assert messages[-1]["total_sentences"] == 2 and messages[-1]["total_frames"] == 2 * FRAMES
    # the first sentence is an ordinary zero-shot request with the session's seed: the same
    # audio as a streamed HTTP request, whichever replica answers it (frames passed unchanged)
    first = http.post("/v1/audio/speech", json={"input": sentences[0]["sentence_text"],
                                                "seed": 5, "response_format": "pcm", "stream": True,
                                                **FIXED})
    assert first.status_code == 200 and first.content == audio[0]
    health = http.get("/health").json()
    assert all(r["in_flight"] == 0 for r in health["replicas"])


@pytest.mark.parametrize("first, code, words", [
    ("[" * 99_999, "invalid_json", f"nested more than {MAX_DEPTH} levels deep"),
    ('{"type": "session.config", ' + ",".join(f'"k{i}": 0' for i in range(MAX_MEMBERS + 1)) + "}",
     "message_too_large", f"more than {MAX_MEMBERS} object members"),
], ids=["deep", "wide"])
def test_a_first_frame_too_costly_to_parse_is_answered_as_the_single_server_answers(
        cluster, first, code, words):
    """Issue 40: the front end parsed a session's first frame with plain json.loads, on the loop
    that relays every session and request. Its shape is now measured first
    (server/limits/json_limits.py); the frame is passed on, and the replica answers it as the single
    server does: the error event, the session still open for a valid config."""
    url, _, log = cluster
    messages = _session(url, ["Hello there."], seed=3, first=first)
    assert messages.pop() == 1000
    error = messages[0]
    message = f"message is {words}; no message is that complex"
    assert error == {"type": "error", "message": message, "code": code,
                     "error": {"message": message, "type": "invalid_request_error",
                               "param": None, "code": code}}
    assert not any(isinstance(m, dict) and m["type"] == "error" for m in messages[1:])
    assert messages[-1]["type"] == "session.done" and messages[-1]["total_sentences"] == 1
    assert "Traceback" not in log.read_text()


def test_a_long_form_request_is_one_recording_with_its_segments(cluster):
    _, http, _ = cluster
    assert SEGMENT_MAX_CHARS < len(ARTICLE) < 300
    response = http.post("/v1/audio/speech", json={"input": ARTICLE, "response_format": "wav",
                                                   "stream": False, **FIXED})  # X-Segments: files
    assert response.status_code == 200, response.text
    segments = json.loads(response.headers["x-segments"])
    assert int(response.headers["x-segment-count"]) == len(segments) >= 2
    assert segments[0][0] == 0 and segments[-1][1] == len(ARTICLE)
    assert all(a[3] == b[2] for a, b in zip(segments, segments[1:]))  # gapless, in order
    samples, rate = sf.read(io.BytesIO(response.content))
    assert rate == 24000 and len(samples) == len(segments) * SAMPLES
    with http.stream("POST", "/v1/audio/speech", json={
            "input": ARTICLE, "response_format": "pcm", "stream": True, "stream_format": "sse",
            **FIXED}) as sse:
        events = [json.loads(line[6:]) for line in sse.iter_lines() if line.startswith("data: ")]
    done = [e for e in events if e["type"] == "speech.segment.done"]
    assert len(done) == len(segments) and events[-1]["type"] == "speech.audio.done"


def _batch(http: httpx.Client, body: dict) -> httpx.Response:
    return http.post("/v1/audio/speech/batch", json=body)


def test_the_batch_endpoint_through_the_front_end(cluster):
    _, http, _ = cluster
    answer = _batch(http, {"items": [{"input": "First one."},
                                     {"input": "Second one.", "response_format": "flac"},
                                     {"input": "Third.", "voice": "alloy"}],
                           "seed": 7, **FIXED})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["total"], body["succeeded"], body["failed"]) == (3, 2, 1)
    results = body["results"]
    assert [r["index"] for r in results] == [0, 1, 2]
    assert [r["media_type"] for r in results[:2]] == ["audio/wav", "audio/flac"]
    for result in results[:2]:
        samples, rate = sf.read(io.BytesIO(base64.b64decode(result["audio_data"])))
        assert rate == 24000 and len(samples) == SAMPLES
    assert (results[2]["status"], results[2]["param"], results[2]["status_code"]) == ("error", "voice", 400)
    malformed = _batch(http, {"items": []})  # the replica's own 400, passed on
    assert malformed.status_code == 400 and malformed.json()["error"]["param"] == "items"


def test_a_batch_is_routed_by_its_reference(cluster):
    _, http, _ = cluster
    ref = base64.b64encode(tone_clip((440, 0.3))).decode()
    batch = {"items": [{"input": "One."}, {"input": "Two."}], "ref_audio": ref,
             "ref_text": "A tone.", **FIXED}
    assert routing_key(batch) is not None
    affinity = _routed(http, "affinity")
    before = _finished_per_replica(http)
    for _ in range(2):
        answer = _batch(http, batch)
        assert answer.status_code == 200 and answer.json()["succeeded"] == 2, answer.text
    assert _routed(http, "affinity") == affinity + 2
    gained = {r: n - before.get(r, 0) for r, n in _finished_per_replica(http).items()}
    assert sorted(gained.values()) == [0, 4], gained  # both batches on the reference's home


def _routed(http: httpx.Client, reason: str) -> float:
    line = f'higgs_serve_router_routed_total{{reason="{reason}"}} '
    return next(float(x.split()[-1]) for x in http.get("/metrics").text.splitlines()
                if x.startswith(line))


def _finished_per_replica(http: httpx.Client) -> dict[str, float]:
    counts: dict[str, float] = {}
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("higgs_serve_requests_total{") and 'outcome="length"' in line:
            replica = line.split('replica="')[1].split('"')[0]
            counts[replica] = counts.get(replica, 0) + float(line.split()[-1])
    return counts
