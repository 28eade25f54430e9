"""The API key on the single server against every way of spelling a target (issue 52): the table
the front end is held to as well (tests/cluster/test_relay_auth.py), and the WebSocket route.
One policy decides for both (server/auth.py)."""

from __future__ import annotations

import json

from fake_engine import FakeEngine
from live_server import fake_settings, start_threaded_server
from websockets.sync.client import connect

from support.auth_cases import KEY, check_targets, check_websocket_targets
from support.raw_http import exchange


def test_every_spelling_of_a_target_needs_the_key(tmp_path):
    live = start_threaded_server(FakeEngine(), fake_settings(tmp_path, api_key=KEY))
    try:
        check_targets(live.url)
        check_websocket_targets(live.url)
        ws = live.url.replace("http://", "ws://")
        with connect(f"{ws}/%76%31/audio/speech/stream?api_key={KEY}") as session:
            session.send(json.dumps({"type": "session.config", "voice": "default"}))
            session.send(json.dumps({"type": "session.close"}))
            assert json.loads(session.recv(timeout=10))["type"] != "error"
    finally:
        live.stop()


def test_without_a_key_only_ambiguous_targets_are_refused(tmp_path):
    live = start_threaded_server(FakeEngine(), fake_settings(tmp_path))
    try:
        for target, status in ((b"/%76%31/models", 200), (b"/v1%2Fmodels", 400),
                               (b"/v1/../v1/models", 400), (b"http://x/v1/models", 200)):
            got, _ = exchange(live.url, b"GET %s HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
                              % target)
            assert [a.status for a in got] == [status], target
    finally:
        live.stop()
