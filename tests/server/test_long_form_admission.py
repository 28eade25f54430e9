"""Long-form requests take the steps single ones take. Their input is split only once the
request is admitted and its input is within --max-input-chars (splitting runs at about 1 s per
million characters: before, a body of millions of characters was split on the event loop first,
and only then refused); their events carry the same response headers."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from fake_engine import FakeEngine, fake_deploy
from live_server import fake_settings, start_threaded_server

from higgs_serve.server.run import long_form

SENTENCE = "A sentence of words. "


@pytest.fixture
def split_calls(tmp_path, monkeypatch):
    calls = []
    split = long_form.group_segments
    monkeypatch.setattr(long_form, "group_segments",
                        lambda text, limit: calls.append(len(text)) or split(text, limit))
    engine = FakeEngine(deploy=fake_deploy(max_num_seqs=1, max_tokens=2000))
    live = start_threaded_server(engine, fake_settings(tmp_path, segment_max_chars=30,
                                                       max_input_chars=200, max_queue=0))
    yield live, engine, calls
    engine.hold.set()
    live.stop()


def _invalid(http: httpx.Client) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith('higgs_serve_requests_total{outcome="invalid"} '):
            return float(line.split()[1])
    raise AssertionError("no invalid count")


def test_an_input_over_the_limit_is_refused_unsplit(split_calls):
    live, _, calls = split_calls
    with httpx.Client(base_url=live.url, timeout=30) as http:
        invalid = _invalid(http)
        response = http.post("/v1/audio/speech", json={"input": SENTENCE * 20})  # 420 chars
        assert response.status_code == 413, response.text
        assert response.json()["error"]["code"] == "input_too_long"
        assert _invalid(http) == invalid + 1
        assert calls == []
        response = http.post("/v1/audio/speech", json={"input": SENTENCE * 5})  # 105 chars
        assert response.status_code == 200 and response.headers["x-segment-count"] == "5"
        assert calls == [105]


def test_a_full_server_refuses_a_long_input_unsplit(split_calls):
    live, engine, calls = split_calls
    engine.hold.clear()  # "HOLD..." waits before its first chunk, keeping the one slot
    with httpx.Client(base_url=live.url, timeout=30) as http, ThreadPoolExecutor(1) as pool:
        held = pool.submit(http.post, "/v1/audio/speech", json={"input": "HOLD on"})
        deadline = time.monotonic() + 5
        while live.app.state.server.gate.in_flight == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        response = http.post("/v1/audio/speech", json={"input": SENTENCE * 5})
        assert response.status_code == 429, response.text
        assert calls == []
        engine.hold.set()
        assert held.result().status_code == 200


def test_long_form_events_ask_proxies_not_to_buffer(split_calls):
    """X-Accel-Buffering: no on long-form SSE as on a single request's (it was missing)."""
    live, _, _ = split_calls
    with httpx.Client(base_url=live.url, timeout=30) as http:
        for text in ("Short.", SENTENCE * 5):
            response = http.post("/v1/audio/speech", json={
                "input": text, "response_format": "pcm", "stream_format": "sse"})
            assert response.status_code == 200
            assert response.headers["x-accel-buffering"] == "no", text
