"""What a batch may hold in all (issue 40 item 8; server/limits/batch_limits.py), against the fake
engine: its input before any work, its audio as played while it is spoken (413
`batch_too_large`, every item stopped, every file freed, no traceback), and an item within them
answered with the file /speech gives the same body with stream false, spilled to disk on the
way and sent with its Content-Length."""

from __future__ import annotations

import base64
import os
import tempfile
import time

import httpx
import pytest
from fake_engine import FakeEngine, fake_deploy
from live_server import fake_settings, metric, start_threaded_server
from server_log import faults, server_log

MAX_AUDIO_S = 40.0  # the fake speaks 2 frames (80 ms) a character, at most 8 s a segment
MAX_INPUT_CHARS = 4000


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    engine = FakeEngine(deploy=fake_deploy(max_num_seqs=2, max_tokens=200))
    settings = fake_settings(tmp_path_factory.mktemp("srv"), max_queue=8,
                             max_input_chars=MAX_INPUT_CHARS, max_audio_s=MAX_AUDIO_S)
    live = start_threaded_server(engine, settings)
    yield live
    live.stop()


def _text(sentences: int) -> str:
    return " ".join(f"This is sentence number {i} of a longer text." for i in range(sentences))


def _spooled_files() -> int:
    """Temporary files this process holds open (the spooled files of whole-file answers)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        count += target.startswith(tempfile.gettempdir()) and target.endswith("(deleted)")
    return count


def _settled(live, timeout_s: float = 5.0) -> None:
    gate, deadline = live.app.state.server.gate, time.monotonic() + timeout_s
    while gate.in_flight:
        assert time.monotonic() < deadline, f"{gate.in_flight} requests still in flight"
        time.sleep(0.01)


def _too_large(answer: httpx.Response, words: str) -> None:
    assert answer.status_code == 413, answer.text
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == ("batch_too_large", "items")
    assert words in error["message"]


def test_a_batch_over_the_input_limit_is_refused_before_any_work(fake):
    requests = len(fake.engine.requests)
    answer = httpx.post(f"{fake.url}/v1/audio/speech/batch", timeout=10, json={
        "items": [{"input": "x" * 1500}, {"input": "y" * 1500}, {"input": "z" * 1001}]})
    _too_large(answer, f"4001 characters of input in all; the limit is {MAX_INPUT_CHARS}")
    assert len(fake.engine.requests) == requests


def test_a_long_item_is_the_speech_file_spilled_and_sent_with_its_length(fake):
    text = _text(26)  # about 1,200 characters: 5 segments, 32+ s of WAV at 48 kHz (3 MB)
    body = {"input": text, "response_format": "wav", "sample_rate": 48000, "seed": 5}
    files = _spooled_files()  # pytest's own capture files among them
    with httpx.Client(base_url=fake.url, timeout=30) as http:
        single = http.post("/v1/audio/speech", json={**body, "stream": False})
        batch = http.post("/v1/audio/speech/batch", json={"items": [body]})
    assert single.status_code == batch.status_code == 200
    assert int(batch.headers["content-length"]) == len(batch.content)
    (item,) = batch.json()["results"]
    audio = base64.b64decode(item["audio_data"])
    assert len(audio) > 1 << 20 and audio == single.content  # spooled past 1 MiB: on disk
    assert item["usage"]["output_tokens"] == int(single.headers["x-usage-output-tokens"])
    _settled(fake)
    assert _spooled_files() == files


def test_an_item_at_the_audio_cap_is_answered_as_speech_answers_it(fake):
    """The batch's limit is one request's: a lone item cut at --max-audio-s is within it."""
    body = {"input": _text(50), "response_format": "pcm", "seed": 2}
    single = httpx.post(f"{fake.url}/v1/audio/speech", json={**body, "stream": False}, timeout=30)
    batch = httpx.post(f"{fake.url}/v1/audio/speech/batch", json={"items": [body]}, timeout=30)
    (item,) = batch.json()["results"]
    assert single.headers["x-finish-reason"] == item["finish_reason"] == "length"
    assert len(single.content) == MAX_AUDIO_S * 24000 * 2
    assert base64.b64decode(item["audio_data"]) == single.content


@pytest.mark.parametrize("items", [
    [{"input": _text(26)}, {"input": _text(26), "seed": 9}],  # 2 x 32 s
    [{"input": _text(26), "speed": 0.5}],  # 32 s spoken, 64 s played
], ids=["two-long-items", "slowed"])
def test_a_batch_whose_audio_passes_the_limit_stops_every_item(fake, items):
    files = _spooled_files()
    with httpx.Client(base_url=fake.url, timeout=30) as http:
        aborts = metric(http, 'higgs_serve_requests_total{outcome="abort"}')
        with server_log() as log:
            answer = http.post("/v1/audio/speech/batch",
                               json={"items": items, "response_format": "wav", "sample_rate": 48000})
            _settled(fake)
        _too_large(answer, f"more than {MAX_AUDIO_S:g} s of audio in all")
        assert metric(http, 'higgs_serve_requests_total{outcome="abort"}') == aborts + len(items)
    assert faults(log) == []
    assert _spooled_files() == files
