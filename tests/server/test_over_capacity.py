"""Issue 53 at the HTTP edge: a stream the server cannot start within --ttfa-budget-s gets 503
with Retry-After at once (OpenAI's error shape), a file never does, a stream that waited says so
(X-Queue-Wait-Ms and /metrics), one that waits past it is withdrawn with a 503, and every streamed
chunk is reported to the engine as it leaves.

The fake engine pins the mapping and the reports; two real servers (tiny model, CPU, one slot)
pin the engine's own refusal and wait: one with a budget no queued stream can meet, one whose
budget lets a second stream wait for the first.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from fake_engine import FakeEngine, fake_deploy
from live_server import fake_settings, metric, serve_subprocess, start_threaded_server

NAME = "higgs-tiny"
PCM_STREAM = {"response_format": "pcm", "stream": True}


# ----------------------------------------------------------------------------- fake engine
def test_a_stream_over_capacity_is_a_503_with_retry_after_and_a_file_is_not(fake_server):
    with httpx.Client(base_url=fake_server.url, timeout=10) as http:
        refused = http.post("/v1/audio/speech", json={"input": "FULL house", **PCM_STREAM})
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == str(fake_server.engine.over_capacity_retry_s)
        error = refused.json()["error"]
        assert (error["type"], error["code"], error["param"]) == ("server_error", "over_capacity", None)
        assert "fake engine is full" in error["message"]
        # a file has no listener waiting on its first byte: no deadline, never refused for it
        file = http.post("/v1/audio/speech", json={"input": "FULL house", "stream": False,
                                                   "response_format": "pcm"})
        assert file.status_code == 200 and "x-queue-wait-ms" not in file.headers
        assert metric(http, 'higgs_serve_requests_total{outcome="over_capacity"}') == 1


def test_a_stream_still_waiting_when_its_budget_runs_out_is_withdrawn_with_a_503(fake_server):
    engine = fake_server.engine
    engine.hold.clear()
    try:
        with httpx.Client(base_url=fake_server.url, timeout=10) as http:
            started = time.perf_counter()
            refused = http.post("/v1/audio/speech", json={"input": "HOLD QUEUED here", **PCM_STREAM})
            took = time.perf_counter() - started
            # Retry-After: when the engine predicts a place opens, not the budget
            assert refused.status_code == 503 and refused.headers["retry-after"] == str(engine.withdrawn_retry_after_s)
            assert refused.json()["error"]["code"] == "over_capacity"
            assert engine.withdraw_after_s <= took < engine.withdraw_after_s + 1.0
            withdrawn = engine.requests[-1].request_id
            assert withdrawn in engine.aborted  # its place in the engine's queue is given up
            # a file that waits as long is never withdrawn
            engine.hold.set()
            file = http.post("/v1/audio/speech", json={"input": "HOLD QUEUED file", "stream": False,
                                                       "response_format": "pcm"})
            assert file.status_code == 200
    finally:
        engine.hold.set()


def test_each_streamed_chunk_is_reported_as_it_leaves(fake_server):
    engine = fake_server.engine
    with httpx.Client(base_url=fake_server.url, timeout=10) as http:
        streams_before = metric(http, "higgs_serve_streams_total")
        slack_before = metric(http, "higgs_serve_stream_slack_seconds_count")
        engine.sent.clear()
        response = http.post("/v1/audio/speech", json={"input": "a short sentence", "seed": 3, **PCM_STREAM})
        assert response.status_code == 200
        assert response.headers["x-queue-wait-ms"] == "0.0"
        request_id = response.headers["x-request-id"]
        reports = [r for r in engine.sent if r[0] == request_id]
        assert sum(samples for _, samples, _ in reports) * 2 == len(response.content)  # every sample
        times = [at for _, _, at in reports]
        assert len(reports) > 1 and times == sorted(times)
        assert metric(http, "higgs_serve_streams_total") == streams_before + 1
        # the lead of each chunk after the first
        assert metric(http, "higgs_serve_stream_slack_seconds_count") == slack_before + len(reports) - 1
        assert metric(http, "higgs_serve_streams_stalled_total") == 0  # the fake is never late


def test_a_long_form_streams_later_segments_are_due_when_its_listener_runs_dry(tmp_path):
    """A long-form stream is one listener: only its first segment may be refused; each later
    segment's first audio is due when the audio sent so far runs out (the response's meter)."""
    engine = FakeEngine(deploy=fake_deploy(max_num_seqs=2, max_tokens=200), frames_per_char=1)
    live = start_threaded_server(engine, fake_settings(tmp_path, segment_max_chars=40, max_input_chars=400))
    try:
        text = " ".join(f"Sentence number {i} is right here." for i in range(4))
        with httpx.Client(base_url=live.url, timeout=10) as http:
            started = time.perf_counter()
            response = http.post("/v1/audio/speech", json={"input": text, **PCM_STREAM})
            assert response.status_code == 200
            segments = [r for r in engine.requests if r.request_id.startswith(response.headers["x-request-id"])]
            assert len(segments) == 4
            first, *later = [r.playback for r in segments]
            assert first.ttfa_budget_s == 1.0 and first.first_audio_due_s is None
            sent_s = sum(samples for rid, samples, _ in engine.sent if rid == segments[0].request_id) / 24000
            for playback in later:
                assert playback.ttfa_budget_s is None  # the response has started: never refused
                assert started < playback.first_audio_due_s  # the listener's clock, not arrival's
            assert later[0].first_audio_due_s >= started + sent_s - 0.5  # its audio before it played
            # every segment's audio was reported under its own engine request
            assert {rid for rid, _, _ in engine.sent} >= {r.request_id for r in segments}
    finally:
        live.stop()


# ----------------------------------------------------------------------------- real servers
def _serve(tiny_model_dir, work, budget_s: float):
    # the deadline policy on (the default profile has it off since issue 59)
    overrides = json.dumps({"0": {"default_sampling_params": {"max_tokens": 400},
                                  "compilation_config": {"cudagraph_capture_sizes": [1]},
                                  "deadlines": {"enabled": True}}})
    return serve_subprocess(tiny_model_dir, work, [
        "--served-model-name", NAME, "--max-num-seqs", "1", "--max-queue", "4",
        "--stage-overrides", overrides, "--ttfa-budget-s", str(budget_s), "--watermark", "off",
        "--voices-dir", str(work / "voices")])


def _body(frames: int, text: str = "A sentence long enough to speak for a while.") -> dict:
    return {"input": text, "max_new_tokens": frames, "min_new_tokens": frames, **PCM_STREAM}


@pytest.fixture(scope="module")
def strict_server(tiny_model_dir, tmp_path_factory):
    """One slot and a 50 ms budget: a stream that would queue behind another cannot meet it."""
    with _serve(tiny_model_dir, tmp_path_factory.mktemp("strict"), 0.05) as server:
        yield server


@pytest.fixture(scope="module")
def patient_server(tiny_model_dir, tmp_path_factory):
    """One slot and a minute's budget: a second stream waits for the first."""
    with _serve(tiny_model_dir, tmp_path_factory.mktemp("patient"), 60.0) as server:
        yield server


class _Held:
    """A stream of `frames` frames read in a thread; `started` is set at its first audio."""

    def __init__(self, url: str, body: dict):
        self.started = threading.Event()
        self.status = 0
        self.headers: dict = {}
        self.num_bytes = 0
        self.thread = threading.Thread(target=self._run, args=(url, body))
        self.thread.start()

    def _run(self, url: str, body: dict) -> None:
        with httpx.Client(base_url=url, timeout=120) as client:
            with client.stream("POST", "/v1/audio/speech", json=body) as response:
                self.status, self.headers = response.status_code, dict(response.headers)
                for data in response.iter_raw():
                    self.num_bytes += len(data)
                    self.started.set()
        self.started.set()

    def join(self) -> None:
        self.thread.join(timeout=120)
        assert not self.thread.is_alive()


def test_the_real_engine_refuses_at_once_the_stream_it_cannot_start_in_time(strict_server):
    with httpx.Client(base_url=strict_server.url, timeout=60) as http:
        long = _Held(strict_server.url, _body(300))
        assert long.started.wait(60)
        started = time.perf_counter()
        refused = http.post("/v1/audio/speech", json=_body(20, "Hello there."))
        took = time.perf_counter() - started
        assert refused.status_code == 503, refused.text
        assert took < 1.0  # at once, not after waiting
        retry_after = int(refused.headers["retry-after"])
        assert retry_after >= 1
        error = refused.json()["error"]
        assert (error["type"], error["code"]) == ("server_error", "over_capacity")
        assert f"retry in {retry_after} s" in error["message"]
        # a file waits for the slot instead: files have no first-audio budget
        file = http.post("/v1/audio/speech", json={**_body(20, "Hello there."), "stream": False})
        long.join()
        assert long.status == 200 and long.num_bytes == 300 * 960 * 2
        assert float(long.headers["x-queue-wait-ms"]) < 1000  # it started on an idle engine
        assert file.status_code == 200 and len(file.content) == 20 * 960 * 2
        assert metric(http, 'higgs_serve_requests_total{outcome="over_capacity"}') == 1
        # the engine is idle again: the same stream now starts
        again = http.post("/v1/audio/speech", json=_body(20, "Hello there."))
        assert again.status_code == 200 and len(again.content) == 20 * 960 * 2


def test_a_stream_that_waited_for_its_place_says_how_long(patient_server):
    with httpx.Client(base_url=patient_server.url, timeout=60) as http:
        first = _Held(patient_server.url, _body(300))
        assert first.started.wait(60)
        second = _Held(patient_server.url, _body(20, "Hello there."))
        first.join()
        second.join()
        assert (first.status, second.status) == (200, 200)
        waited_ms = float(second.headers["x-queue-wait-ms"])
        assert waited_ms > 100  # it waited while the first spoke its 300 frames
        assert float(second.headers["x-time-to-first-audio-ms"]) >= waited_ms
        assert metric(http, "higgs_serve_queue_wait_seconds_count") == 2
        assert metric(http, "higgs_serve_queue_wait_seconds_sum") >= waited_ms / 1000
        assert metric(http, "higgs_serve_streams_total") == 2
        assert metric(http, "higgs_serve_stream_capacity") >= 1
