"""cluster/relay/ws_relay.session_key: a first frame's shape is measured before the front end parses
it (server/limits/json_limits.py), so a frame too costly to parse never reaches json.loads on the loop
that relays every session; ordinary frames still give their voice as the affinity key."""

from __future__ import annotations

import json

import pytest

from higgs_serve.cluster.relay import ws_relay
from higgs_serve.server.limits.json_limits import MAX_CONTAINERS, MAX_MEMBERS


class _CountingJson:
    def __init__(self):
        self.calls = 0

    def loads(self, text):
        self.calls += 1
        return json.loads(text)


@pytest.fixture
def parsed(monkeypatch):
    counting = _CountingJson()
    monkeypatch.setattr(ws_relay, "json", counting)
    return counting


@pytest.mark.parametrize("frame", [
    "[" * 99_999,
    b"[" * 99_999,
    '{"type": "session.config", ' + ",".join(f'"k{i}": 0' for i in range(MAX_MEMBERS + 1)) + "}",
    '{"type": "session.config", "x": [' + ",".join(["[]"] * (MAX_CONTAINERS + 1)) + "]}",
], ids=["deep", "deep-bytes", "members", "containers"])
def test_a_frame_too_costly_to_parse_has_no_key_and_is_never_parsed(parsed, frame):
    assert ws_relay.session_key(frame) is None
    assert parsed.calls == 0


def test_an_ordinary_first_frame_still_names_its_voice(parsed):
    flat = json.dumps({"type": "session.config", "voice": "alice"})
    nested = json.dumps({"type": "session.config", "session": {"voice": "alice"}})
    assert ws_relay.session_key(flat) == ws_relay.session_key(nested) is not None
    assert ws_relay.session_key("not json") is None
    assert parsed.calls == 3
