"""Hostile input and faults (issue 28), kept as a CI-size regression suite.

Against the real server (`higgs_serve.cli serve <tiny model>` in a subprocess, measured from the
outside): reference-clip bombs cost little memory and /health keeps answering. The fast,
fake-engine cases (slow readers, body limits, races, auth) live beside it in this module.
"""

from __future__ import annotations

import base64
import time

import httpx
import pytest
from bombs import bombs
from live_server import Subprocess, serve_subprocess

NAME = "higgs-tiny-hostile"
RSS_GROWTH_LIMIT = 200 * 1024 * 1024


@pytest.fixture(scope="module")
def real_server(tiny_model_dir, tmp_path_factory) -> Subprocess:
    work = tmp_path_factory.mktemp("hostile")
    args = ["--served-model-name", NAME, "--voices-dir", str(work / "voices")]
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
    growth = _peak_rss_bytes(real_server.process.pid) - before
    assert growth < RSS_GROWTH_LIMIT, f"peak RSS grew by {growth / 2**20:.0f} MB"
