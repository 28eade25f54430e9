"""Hostile input and faults (issue 28): the CI-size regression suite.

Against the real server (`higgs_serve.cli serve <tiny model>` in a subprocess, measured from the
outside): reference-clip bombs cost little memory while /health keeps answering, and a prompt
too long for the model is a 413. Against the fake engine: a matrix of hostile bodies, schemathesis
over every operation (with and without the API key), the OpenAPI document. The other issue 28
cases: test_voice_races.py, test_slow_clients.py, test_auth_and_urls.py.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from bombs import bombs
from fake_engine import FakeEngine
from fuzz import clamp_frame_fields, fuzz_server
from hostile import tone_wav
from live_server import (
    Subprocess,
    fake_settings,
    serve_subprocess,
    start_threaded_server,
)

NAME = "higgs-tiny-hostile"
RSS_GROWTH_LIMIT = 200 * 1024 * 1024


@pytest.fixture(scope="module")
def real_server(tiny_model_dir, tmp_path_factory) -> Subprocess:
    work = tmp_path_factory.mktemp("hostile")
    args = ["--served-model-name", NAME, "--voices-dir", str(work / "voices"),
            "--stage-overrides", json.dumps({"0": {"max_model_len": 512}})]
    with serve_subprocess(tiny_model_dir, work, args) as server:
        yield server


def _peak_rss_bytes(pid: int) -> int:
    """The process's high-water resident set (VmHWM), in bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/<pid>/status")


def test_reference_bombs_are_refused_with_little_memory(real_server):
    """Each bomb (8-channel silence, a 1 Hz header, 20 minutes of FLAC without a length, ...) is
    a 400 naming its field, through `ref_audio` and a voice upload alike, and the server's peak
    RSS grows by less than 200 MB over all of them (it grew by 1.4-1.8 GB per bomb before)."""
    before = _peak_rss_bytes(real_server.process.pid)
    latencies, stop = [], threading.Event()

    def poll_health() -> None:  # /health must answer within 1 s throughout
        with httpx.Client(base_url=real_server.url, timeout=1.0) as health:
            while not stop.is_set():
                started = time.monotonic()
                assert health.get("/health").status_code == 200
                latencies.append(time.monotonic() - started)
                time.sleep(0.05)

    poller = ThreadPoolExecutor(1).submit(poll_health)
    with httpx.Client(base_url=real_server.url, timeout=60) as http:
        for name, data in bombs():
            started = time.monotonic()
            response = http.post("/v1/audio/speech", json={
                "input": "hi", "ref_audio": base64.b64encode(data).decode()})
            assert response.status_code == 400, (name, response.text)
            assert response.json()["error"]["param"] == "ref_audio", name
            response = http.post("/v1/audio/voices", data={"name": "bomb"},
                                 files={"audio_sample": ("bomb.bin", data)})
            assert response.status_code == 400, (name, response.text)
            assert response.json()["error"]["param"] == "audio_sample", name
            assert time.monotonic() - started < 10, name
            assert http.get("/health").status_code == 200
        assert http.get("/v1/audio/voices").json()["data"] == []
    stop.set()
    poller.result()  # re-raises a /health timeout
    assert latencies and max(latencies) < 1.0
    growth = _peak_rss_bytes(real_server.process.pid) - before
    assert growth < RSS_GROWTH_LIMIT, f"peak RSS grew by {growth / 2**20:.0f} MB"


def test_a_prompt_too_long_for_the_model_is_413_on_input(real_server):
    """The real engine (max_model_len 512 here): a prompt that leaves no room to speak is a 413
    naming `input` (before: a 400 on max_new_tokens carrying an internal request id). The input
    is long-form: its second segment (cloned from the first's codes) is the one too long, so only
    a file (stream: false) can still answer 413; a stream would already have started."""
    text = " ".join(f"word{i}" for i in range(400))  # < 4096 chars, > 512 tokens
    response = httpx.post(f"{real_server.url}/v1/audio/speech",
                          json={"input": text, "stream": False}, timeout=60)
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("input", "input_too_long")
    assert "leave room to speak" in error["message"] and "speech-" not in error["message"]



# ----------------------------------------------------------------------------- small 500s
def test_an_empty_json_key_is_a_400_naming_it(fake_server):
    response = httpx.post(f"{fake_server.url}/v1/audio/speech", json={"input": "hi", "": 0})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == '""'


# ----------------------------------------------------------------------------- the document
def test_openapi_documents_metrics_as_text_and_the_error_statuses(fake_server):
    schema = httpx.get(f"{fake_server.url}/openapi.json").json()
    metrics = schema["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(metrics) == ["text/plain"]
    for path, methods in [("/v1/audio/speech", ["post"]), ("/v1/audio/voices", ["get", "post"]),
                          ("/v1/audio/voices/{name}", ["delete"]), ("/v1/models", ["get"])]:
        assert sorted(schema["paths"][path]) == methods  # no OPTIONS/HEAD operations
        for method in methods:
            assert "500" in schema["paths"][path][method]["responses"], (path, method)
    assert "404" in schema["paths"]["/v1/audio/speech"]["post"]["responses"]


def test_an_empty_ref_text_is_accepted(fake_server):
    response = httpx.post(f"{fake_server.url}/v1/audio/speech", json={"input": "hi", "ref_text": ""})
    assert response.status_code == 200, response.text




# ----------------------------------------------------------------------------- fuzzing
def test_fuzzing_every_operation_with_and_without_the_key_gives_no_5xx(tmp_path):
    """schemathesis over every operation (GET included) of a server with an API key, first with
    the key, then with a wrong one: never a 5xx, the engine alive after each case."""
    settings = fake_settings(tmp_path, api_key="k3y", max_ref_audio_bytes=50_000)
    live = start_threaded_server(FakeEngine(), settings,
                                 reference_encoder=lambda audio: np.zeros((3, 8), np.int64))
    try:
        openapi = httpx.get(f"{live.url}/openapi.json").json()
        openapi = clamp_frame_fields(openapi, 20)
        every = ("GET", "POST", "DELETE")
        fuzz_server(live.url, openapi, max_examples=6, headers={"Authorization": "Bearer k3y"},
                    methods=every)
        fuzz_server(live.url, openapi, max_examples=2, headers={"Authorization": "Bearer no"},
                    methods=every)
    finally:
        live.stop()


def _hostile_bodies() -> list[tuple[str, bytes | dict]]:
    return [
        ("empty key", {"input": "hi", "": 0}),
        ("control tokens in input", {"input": "<|audio|><|endoftext|><|tts|> hi"}),
        ("control tokens in ref_text", {"input": "hi", "ref_text": "<|ref_audio|>"}),
        ("NaN speed", b'{"input": "hi", "speed": NaN}'),
        ("Infinity temperature", b'{"input": "hi", "temperature": Infinity}'),
        ("deep nesting", b'{"input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
        ("huge int", b'{"input": "hi", "seed": ' + b"9" * 5000 + b"}"),
        ("lone surrogate", b'{"input": "\\ud800"}'),
        ("nul in input", {"input": "hi\x00there"}),
        ("utf-16 body", '{"input": "hi"}'.encode("utf-16")),
        ("voice with newline", {"input": "hi", "voice": "evil\n"}),
        ("model with newline", {"input": "hi", "model": "x\r\nSet-Cookie: a=b"}),
        ("ref_audio tab url", {"input": "hi", "ref_audio": "http://exa\tmple.com/a.wav"}),
        ("ref_audio 1 Hz wav", {"input": "hi", "ref_audio": base64.b64encode(
            bombs()[1][1]).decode()}),
    ]


def test_hostile_bodies_never_get_a_5xx(fake_server):
    with httpx.Client(base_url=fake_server.url, timeout=30) as http:
        for case, body in _hostile_bodies():
            if isinstance(body, dict):
                response = http.post("/v1/audio/speech", json=body)
            else:
                response = http.post("/v1/audio/speech", content=body,
                                     headers={"Content-Type": "application/json"})
            assert response.status_code < 500, (case, response.status_code, response.text)
            if response.status_code != 200:
                assert set(response.json()["error"]) == {"message", "type", "param", "code"}, case
            assert http.get("/health").status_code == 200, case
        for name in ("evil%0A", "a%00b", "..", "%2e%2e%2fetc"):
            assert http.delete(f"/v1/audio/voices/{name}").status_code in (400, 404), name
            response = http.post("/v1/audio/voices", data={"name": name.replace("%0A", "\n")},
                                 files={"audio_sample": ("a.wav", tone_wav(1.0, 200))})
            assert response.status_code == 400, (name, response.text)


def test_the_limits_section_matches_the_code():
    """docs/api.md states each limit once; its numbers are the code's."""
    from pathlib import Path

    from higgs_serve.audio import decode
    from higgs_serve.server import settings
    from higgs_serve.server.plan import ref_audio
    from higgs_serve.server.app import SHUTDOWN_ABORT_WINDOW_S
    from higgs_serve.server.settings import AUDIO_WORKERS, MULTIPART_OVERHEAD_BYTES, ServerSettings
    from higgs_serve.voices.registry import (
        MAX_REFERENCE_SECONDS,
        MAX_UPLOAD_BYTES,
        MIN_REFERENCE_SECONDS,
    )

    text = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    limits = text[text.index("## Limits"):]
    defaults = ServerSettings()
    expected = [
        f"{defaults.max_json_body_bytes:,} bytes", f"{MAX_UPLOAD_BYTES + MULTIPART_OVERHEAD_BYTES:,}",
        f"{MIN_REFERENCE_SECONDS}–{MAX_REFERENCE_SECONDS:g} s",
        f"{decode.MIN_RATE_HZ:,}–{decode.MAX_RATE_HZ:,} Hz", f"1 or {decode.MAX_CHANNELS} channels",
        f"one {ref_audio.FETCH_DEADLINE_S:g} s deadline", f"({defaults.send_timeout_s:g} s)",
        f"({defaults.max_input_chars})", f"{AUDIO_WORKERS} threads",
        f"{defaults.graceful_shutdown_s} s grace", f"within {SHUTDOWN_ABORT_WINDOW_S} s",
        f"{defaults.max_ref_audio_bytes // 2**20} MiB",
    ]
    for phrase in expected:
        assert phrase in limits, phrase
    assert settings.DEFAULT_SEND_TIMEOUT_S == defaults.send_timeout_s


def batch_memory_figures() -> list[str]:
    """The batch row's measured figures, as benchmarks/results/batch_memory_cpu.json has them."""
    import json
    from pathlib import Path

    result = json.loads((Path(__file__).resolve().parents[2] / "benchmarks" / "results"
                         / "batch_memory_cpu.json").read_text())
    cases = {case["case"]: case for case in result["cases"]}
    admitted = cases["admitted"]
    return [f"RSS grew by at most {max(c['rss_growth_mb'] for c in cases.values()):.0f} MB",
            f"{admitted['spooled_peak_mb']:.0f} MB spooled", f"{admitted['answer_mb']:.0f} MB answer",
            "batch_memory_cpu.json"]


def test_the_limits_section_covers_the_websocket_batch_and_long_form_limits():
    """Issue 40: the surfaces added since issue 28 have their limits in the same table, and
    its numbers are the code's."""
    from pathlib import Path

    from higgs_serve.server.limits import json_limits
    from higgs_serve.server.run import long_form
    from higgs_serve.server.websocket import session as ws_session
    from higgs_serve.server.last_mile.audio_file import SPOOL_MEMORY_BYTES
    from higgs_serve.server.last_mile.batch_answer import BASE64_BLOCK_BYTES
    from higgs_serve.server.schemas import MAX_BATCH_ITEMS
    from higgs_serve.server.settings import ServerSettings
    from higgs_serve.voices.codes_file import MAX_REFERENCE_FRAMES

    text = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    limits = text[text.index("## Limits"):text.index("## Batch")]
    defaults = ServerSettings()
    rows = {line.split("|")[1].strip(): line for line in limits.splitlines()
            if line.startswith("| ") and not line.startswith("| what")}
    expected = {
        "JSON shape (bodies and WebSocket messages)": [
            f"nested at most {json_limits.MAX_DEPTH} deep", f"{json_limits.MAX_CONTAINERS:,} arrays",
            f"{json_limits.MAX_MEMBERS:,} object members", f"{json_limits.MAX_VALUES:,} values"],
        "`reference_codes`": [f"at most {MAX_REFERENCE_FRAMES} rows"],
        "long-form audio": [f"({defaults.max_audio_s:g} s)",
                            f"at most every {long_form.PROGRESS_LOG_S:g} s"],
        "long-form timestamps header": [f"up to {long_form.MAX_SEGMENTS_HEADER_BYTES} bytes"],
        "batch": [f"1–{MAX_BATCH_ITEMS} items", "`max_num_seqs` items",
                  f"`--max-input-chars` ({defaults.max_input_chars})",
                  f"`--max-audio-s` ({defaults.max_audio_s:g} s)", "413 `batch_too_large`",
                  f"about {SPOOL_MEMORY_BYTES >> 20} MiB per item",
                  f"{BASE64_BLOCK_BYTES >> 10} KiB of audio at a time",
                  *batch_memory_figures()],
        "WebSocket message": [f"{defaults.max_ws_message_bytes:,} bytes"],
        "WebSocket text waiting": [f"({defaults.max_input_chars})",
                                   f"{ws_session.MAX_PENDING_UTTERANCES} utterance ends"],
        "WebSocket session end": [f"({defaults.ws_idle_timeout_s:g} s)", "close 1000",
                                  f"close {ws_session.CLOSE_POLICY}",
                                  f"at most {ws_session.FINAL_SEND_S:g} s"],
    }
    for row, phrases in expected.items():
        assert row in rows, row
        for phrase in phrases:
            assert phrase in rows[row], (row, phrase)
    assert defaults.max_ws_message_bytes == defaults.max_json_body_bytes
