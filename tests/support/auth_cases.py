"""The API key against every way of spelling a target (issue 52), for the single server and the
front end alike: the same table, the same answers (server/auth.py is the one policy)."""

from __future__ import annotations

import json

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from support.raw_http import exchange

KEY = "K3y"
# (method, target, status without the key, status with it; None: whatever the route answers)
CASES = [
    ("GET", b"/v1/audio/voices", 401, 200),
    ("GET", b"/v1%2Faudio/voices", 400, 400),          # an escaped '/': ambiguous
    ("GET", b"/v1%2faudio%2fvoices", 400, 400),
    ("GET", b"/%76%31/audio/voices", 401, 200),         # escapes decoded: /v1/audio/voices
    ("GET", b"/v1/audio/%76oices", 401, 200),
    ("GET", b"http://x/v1/audio/voices", 401, 200),     # absolute form
    ("GET", b"HTTP://x/%76%31/models", 401, 200),
    ("GET", b"/v1%2Fmodels", 400, 400),
    ("GET", b"/%76%31/models", 401, 200),
    ("GET", b"/v1/models/", 401, None),
    ("GET", b"/v1/./models", 400, 400),                 # dot segments: ambiguous
    ("GET", b"/health/../v1/models", 400, 400),
    ("GET", b"/%2e%2e/v1/models", 400, 400),
    ("GET", b"/v1/models%", 400, 400),                  # a malformed escape
    ("GET", b"/v1/models%00", 400, 400),
    ("DELETE", b"/%76%31/audio/voices/nobody", 401, 404),
    ("POST", b"/%76%31/audio/voices", 401, None),
    ("POST", b"/%76%31/audio/watermark/detect", 401, None),
    ("POST", b"http://x/v1/audio/watermark/detect", 401, None),
    ("POST", b"/%76%31/audio/speech", 401, 200),
    ("POST", b"/v1/audio/speech/batch?x=1", 401, None),
    ("GET", b"/health", 200, 200),                      # the public list
    ("GET", b"http://x/health", 200, 200),
    ("GET", b"/ready", 200, 200),
    ("GET", b"/metrics", 200, 200),
    ("GET", b"/openapi.json", 200, 200),
    ("GET", b"/health/", 401, None),                    # public means exactly these paths
    ("GET", b"/%68ealth", 200, 200),                    # ...once normalized
    ("GET", b"/", 200, 200),                            # the playground page and its files (issue 60)
    ("GET", b"/%70layground/app.js", 200, 200),
    ("GET", b"/playground/../v1/models", 400, 400),
]
SPEECH_BODY = b'{"input": "Hello.", "response_format": "pcm"}'


def _request(method: str, target: bytes, key: str | None) -> bytes:
    lines = [b"%s %s HTTP/1.1" % (method.encode(), target), b"host: x", b"connection: close"]
    if key is not None:
        lines.append(b"authorization: Bearer " + key.encode())
    body = SPEECH_BODY if method == "POST" else b""
    if method == "POST":
        lines += [b"content-type: application/json", b"content-length: %d" % len(body)]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def check_targets(url: str) -> None:
    """Every case of CASES, without the key, with a wrong one and with the right one."""
    failures = []
    for method, target, without, with_key in CASES:
        for key, expected in ((None, without), ("wrong", without), (KEY, with_key)):
            got, _ = exchange(url, _request(method, target, key))
            status = got[0].status if got else None
            if expected is not None and status != expected:
                failures.append((method, target, key, status, expected))
            if expected is None and (status is None or status == 401 or status >= 500):
                failures.append((method, target, key, status, "a route's own answer"))
            if status == expected and status in (400, 401):
                code = json.loads(got[0].body)["error"]["code"]
                wanted = "invalid_api_key" if status == 401 else "invalid_request_target"
                if code != wanted:
                    failures.append((method, target, key, code, wanted))
    assert failures == [], failures


def check_websocket_targets(url: str) -> None:
    """The streaming route spelled differently: without the key an `error` event and close
    1008 (the session's refusal), an ambiguous spelling no session at all (400)."""
    ws = url.replace("http://", "ws://")
    for path in ("/v1/audio/speech/stream", "/%76%31/audio/speech/stream",
                 "/v1/audio/speech/stream?api_key=wrong"):
        with connect(ws + path) as session:
            event = json.loads(session.recv(timeout=5))
            assert event["type"] == "error" and event["code"] == "invalid_api_key", (path, event)
            with pytest.raises(ConnectionClosed) as closed:
                session.recv(timeout=5)
        assert closed.value.rcvd.code == 1008, path
    for path in ("/v1%2Faudio/speech/stream", "/v1/audio/../audio/speech/stream"):
        with pytest.raises(InvalidStatus) as refused:
            connect(ws + path, open_timeout=5)
        assert refused.value.response.status_code == 400, path
