"""The table of bad /v1/audio/speech requests (errors as in docs/api.md), shared by the fake-engine and
real-server tests: each must get its status and an OpenAI-shaped error naming the field."""

from __future__ import annotations

import base64

import httpx


def bad_requests(max_input_chars: int, max_tokens: int) -> list[tuple[str, object, int, str | None]]:
    """(case id, JSON body (dict) or raw bytes, expected status, expected `param`).

    max_input_chars / max_tokens: the server's input limit and its profile's frame ceiling.
    """
    long_input = "x" * (max_input_chars + 1)
    return [
        ("malformed json", b'{"input": "hi"', 400, None),
        ("body not an object", b'["hi"]', 400, None),
        ("missing input", {"voice": "default"}, 400, "input"),
        ("empty input", {"input": ""}, 400, "input"),
        ("whitespace input", {"input": " \n\t "}, 400, "input"),
        ("input wrong type", {"input": 42}, 400, "input"),
        ("input too long", {"input": long_input}, 413, "input"),
        ("unknown response_format", {"input": "hi", "response_format": "ogg"}, 400, "response_format"),
        ("opus at a rate it cannot carry", {"input": "hi", "response_format": "opus",
                                            "sample_rate": 22050}, 400, "sample_rate"),
        ("telephony at a rate not offered", {"input": "hi", "response_format": "ulaw",
                                             "sample_rate": 12345}, 400, "sample_rate"),
        ("sample_rate zero", {"input": "hi", "sample_rate": 0}, 400, "sample_rate"),
        ("unknown stream_format", {"input": "hi", "stream_format": "ws"}, 400, "stream_format"),
        ("stream false + stream_format", {"input": "hi", "stream": False, "stream_format": "sse"},
         400, "stream_format"),
        ("first chunk of a file", {"input": "hi", "stream": False,
                                   "initial_codec_chunk_frames": 1}, 400,
         "initial_codec_chunk_frames"),
        ("speed out of range", {"input": "hi", "speed": 5.0}, 400, "speed"),
        ("speed wrong type", {"input": "hi", "speed": "fast"}, 400, "speed"),
        ("unknown voice", {"input": "hi", "voice": "nobody"}, 400, "voice"),
        ("openai stock voice", {"input": "hi", "voice": "alloy"}, 400, "voice"),
        ("wrong model", {"input": "hi", "model": "tts-1"}, 404, "model"),
        ("instructions", {"input": "hi", "instructions": "whisper"}, 400, "instructions"),
        ("temperature too high", {"input": "hi", "temperature": 3.0}, 400, "temperature"),
        ("temperature string", {"input": "hi", "temperature": "0.5"}, 400, "temperature"),
        ("top_p zero", {"input": "hi", "top_p": 0.0}, 400, "top_p"),
        ("top_k negative", {"input": "hi", "top_k": -1}, 400, "top_k"),
        ("top_k float", {"input": "hi", "top_k": 2.5}, 400, "top_k"),
        ("seed negative", {"input": "hi", "seed": -1}, 400, "seed"),
        ("seed too big", {"input": "hi", "seed": 2**63}, 400, "seed"),
        ("max_new_tokens zero", {"input": "hi", "max_new_tokens": 0}, 400, "max_new_tokens"),
        ("max_new_tokens above profile", {"input": "hi", "max_new_tokens": max_tokens + 1}, 400,
         "max_new_tokens"),
        ("min above max", {"input": "hi", "max_new_tokens": 10, "min_new_tokens": 11}, 400,
         "min_new_tokens"),
        ("bad base64 ref_audio", {"input": "hi", "ref_audio": "%%%not-base64%%%"}, 400, "ref_audio"),
        ("bad data uri", {"input": "hi", "ref_audio": "data:audio/wav,plain"}, 400, "ref_audio"),
        ("ref_audio not audio", {"input": "hi", "ref_audio": base64.b64encode(b"nope").decode()},
         400, "ref_audio"),
        ("ref_audio url not allowed", {"input": "hi", "ref_audio": "https://example.com/a.wav"},
         400, "ref_audio"),
        ("ref_audio file url", {"input": "hi", "ref_audio": "file:///etc/passwd"}, 400, "ref_audio"),
        ("ref_text without ref_audio", {"input": "hi", "ref_text": "words"}, 400, "ref_text"),
        ("unknown fields", {"input": "hi", "emotion": "calm", "volume": 2}, 400, "emotion,volume"),
    ]


def post_bad_request(http: httpx.Client, body, status: int, param: str | None) -> None:
    if isinstance(body, bytes):
        response = http.post("/v1/audio/speech", content=body,
                             headers={"content-type": "application/json"})
    else:
        response = http.post("/v1/audio/speech", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] == param
    assert "Traceback" not in error["message"]
