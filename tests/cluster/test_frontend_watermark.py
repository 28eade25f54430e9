"""The watermark through the data-parallel front end (conftest.py's two tiny-model CPU replicas):
the replicas mark what they generate (the mark is on by default and `--watermark` is passed to
them), and the front end answers POST /v1/audio/watermark/detect itself (its control plane, a
CPU detector of its own), after the relay's key and body-limit checks (tests/cluster/test_relay.py
has the limit)."""

from __future__ import annotations

FRAMES = 50  # 2 s: the tiny model's audio scores ~1.0 marked


def test_audio_through_the_front_end_is_marked_and_detected_there(cluster):
    _, http, _ = cluster
    answer = http.post("/v1/audio/speech", json={"input": "Hello there, how are you today?", "seed": 3,
                                                 "response_format": "wav", "stream": False,
                                                 "max_new_tokens": FRAMES, "min_new_tokens": FRAMES})
    assert answer.status_code == 200, answer.text
    found = http.post("/v1/audio/watermark/detect", files={"file": ("speech.wav", answer.content)})
    assert found.status_code == 200, found.text
    # the tiny model's audio is not speech: the mark is found (score), the verdict inconclusive
    assert found.json()["score"] >= 0.9 and found.json()["verdict"] in ("marked", "inconclusive")
    refused = http.post("/v1/audio/watermark/detect", files={"file": ("junk.wav", b"not audio" * 10)})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "file"
