"""Two tiny-model CPU replicas behind the data-parallel front end (`higgs-serve serve
--data-parallel-size 2 --device cpu`), on loopback, driven by the official openai client and
httpx: streaming and file requests, a voice registered once and used on every replica, a burst
spread over both, a killed replica routed around and restarted, aggregated /metrics.
The front end and its replicas are conftest.py's `cluster`, shared with test_frontend_e2e_*.py.
"""

from __future__ import annotations

import io
import os
import signal
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import soundfile as sf

from support.cluster_e2e import (
    FIXED,
    FRAMES,
    LONG_TEXT,
    PCM_BYTES,
    replica_processes,
    tone_clip,
    wait_for,
)


def _clip() -> bytes:
    return tone_clip((220, 0.3), (1250, 0.2))


def _replicas(http: httpx.Client) -> list[dict]:
    return http.get("/health").json()["replicas"]


def _sockets(log: Path) -> list[str]:
    """The replicas' private sockets (conftest.py's front end keeps its work directory beside
    its log)."""
    return [socket for _, socket in replica_processes(log.parent / "tmp").values()]


def _direct(socket_path: str) -> httpx.Client:
    """Straight to a replica, over its private Unix socket (the test runs as the front end's user)."""
    return httpx.Client(transport=httpx.HTTPTransport(uds=socket_path),
                        base_url="http://replica", timeout=60)


def _speech(http: httpx.Client, **body) -> httpx.Response:
    return http.post("/v1/audio/speech", json={"input": "Hello there.", **FIXED, **body})


def test_ready_says_how_many_replicas(cluster):
    _, http, _ = cluster
    assert http.get("/ready").json() == {"status": "ready", "replicas_ready": 2, "replicas_total": 2}
    assert http.get("/v1/models").json()["data"][0]["id"] == "higgs-tiny-dp"


def test_streaming_and_file_requests_pass_through(cluster):
    url, _, _ = cluster
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
    with client.audio.speech.with_streaming_response.create(
            model="higgs-tiny-dp", voice="default", input="Hello there.", response_format="pcm",
            stream_format="audio", extra_body=FIXED) as response:
        assert response.headers["x-sample-rate"] == "24000"
        pcm = b"".join(response.iter_bytes())
    assert len(pcm) == PCM_BYTES
    with client.audio.speech.with_streaming_response.create(
            model="higgs-tiny-dp", voice="default", input="Hello there.", response_format="pcm",
            stream_format="sse", extra_body=FIXED) as response:
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert '"speech.audio.done"' in events[-1]
    audio = client.audio.speech.create(model="higgs-tiny-dp", voice="default", input="Hello.",
                                       response_format="wav", extra_body=FIXED)
    samples, rate = sf.read(io.BytesIO(audio.content))
    assert rate == 24000 and len(samples) == FRAMES * 960


def test_replicas_listen_only_where_the_front_end_reaches_them(cluster):
    _, http, log = cluster
    for replica in _replicas(http):  # public: no TCP port, socket or pid to reach past it
        assert set(replica) == {"id", "ready", "restarts", "in_flight"}
    sockets = _sockets(log)
    assert len(sockets) == 2
    for socket_path in sockets:
        mode = stat.S_IMODE(Path(socket_path).parent.stat().st_mode)
        assert mode == 0o700  # the front end's user only


def test_hostile_bodies_get_the_single_servers_answers(cluster):
    url, http, _ = cluster
    nested = http.post("/v1/audio/speech", content=b"[" * 50_000,
                       headers={"content-type": "application/json"})
    assert nested.status_code == 400, nested.text  # the replica's 400, relayed
    too_big = http.post("/v1/audio/speech", content=b"x" * (20 * 1024 * 1024))
    assert too_big.status_code == 413 and too_big.json()["error"]["code"] == "body_too_large"
    assert http.get("/ready").json()["replicas_ready"] == 2  # nobody was taken out of rotation


def test_errors_of_a_replica_reach_the_client_unchanged(cluster):
    _, http, _ = cluster
    response = http.post("/v1/audio/speech", json={"input": "x", "voice": "alloy"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "voice"


def test_a_burst_is_spread_over_both_replicas(cluster):
    _, http, _ = cluster
    before = _served_per_replica(http)
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda _: _speech(http, response_format="pcm").status_code, range(8)))
    assert statuses == [200] * 8
    after = _served_per_replica(http)
    gained = {r: after[r] - before.get(r, 0) for r in after}
    assert sum(gained.values()) == 8 and min(gained.values()) >= 1, gained


def _served_per_replica(http: httpx.Client) -> dict[str, float]:
    return _outcomes(http, "length")


def test_a_voice_registered_once_is_used_on_every_replica(cluster):
    _, http, log = cluster
    created = http.post("/v1/audio/voices", data={"name": "narrator", "ref_text": "A tone."},
                        files={"audio_sample": ("clip.wav", _clip(), "audio/wav")})
    assert created.status_code == 200, created.text
    assert [v["name"] for v in http.get("/v1/audio/voices").json()["data"]] == ["narrator"]
    for socket_path in _sockets(log):  # straight to each replica: the voice is there and works
        direct = _direct(socket_path)
        assert [v["name"] for v in direct.get("/v1/audio/voices").json()["data"]] == ["narrator"]
        assert _speech(direct, voice="narrator", response_format="pcm").status_code == 200
    before = _metric(http, 'higgs_serve_router_routed_total{reason="affinity"}')
    hits = _summed(http, "higgs_serve_prefix_cache_hits_total")
    for _ in range(3):  # through the front end: always the same (home) replica
        assert _speech(http, voice="narrator", response_format="pcm").status_code == 200
    assert _metric(http, 'higgs_serve_router_routed_total{reason="affinity"}') == before + 3
    # the voice's prompt blocks are reused from the prefix cache of its home replica
    assert _summed(http, "higgs_serve_prefix_cache_hits_total") > hits
    assert _metric(http, "higgs_serve_router_affinity_ratio") == 1.0
    assert http.post("/v1/audio/voices", data={"name": "narrator"},
                     files={"audio_sample": ("c.wav", _clip(), "audio/wav")}).status_code == 409
    replaced = http.post("/v1/audio/voices", data={"name": "narrator", "overwrite": "true",
                                                   "consent": "rec-42", "ref_text": "A tone."},
                         files={"audio_sample": ("c.wav", _clip(), "audio/wav")})
    assert replaced.status_code == 200 and replaced.json()["replaced"] is True
    for socket_path in _sockets(log):  # the replacement and its fields reached every replica
        listed = _direct(socket_path).get("/v1/audio/voices").json()["data"]
        assert [(v["name"], v["consent"]) for v in listed] == [("narrator", "rec-42")]


def _summed(http: httpx.Client, name: str) -> float:
    """A per-replica series summed over the replicas."""
    return sum(float(line.split()[-1]) for line in http.get("/metrics").text.splitlines()
               if line.startswith(name + "{"))


def _metric(http: httpx.Client, name: str) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not exported")


def test_a_killed_replica_is_routed_around_and_restarted(cluster):
    _, http, log = cluster
    victim = _replicas(http)[0]
    pid, _ = replica_processes(log.parent / "tmp")[victim["id"]]
    os.kill(pid, signal.SIGKILL)
    for _ in range(4):  # meanwhile every request is served by the other replica
        assert _speech(http, response_format="pcm").status_code == 200
    assert http.get("/ready").status_code == 200
    restarted = wait_for(lambda: next((r for r in _replicas(http) if r["id"] == victim["id"]
                                    and r["restarts"] >= 1 and r["ready"]), None),
                      240, "the killed replica back", log)
    new_pid, socket_path = replica_processes(log.parent / "tmp")[victim["id"]]
    assert new_pid != pid
    direct = _direct(socket_path)  # it has the voices again
    assert [v["name"] for v in direct.get("/v1/audio/voices").json()["data"]] == ["narrator"]
    assert 'higgs_serve_router_replica_restarts_total{replica="0"} 1.0' in http.get("/metrics").text


def test_deleting_a_voice_removes_it_everywhere(cluster):
    _, http, log = cluster
    assert http.delete("/v1/audio/voices/narrator").json()["deleted"] is True
    for socket_path in _sockets(log):
        listed = _direct(socket_path).get("/v1/audio/voices").json()["data"]
        assert listed == []
    assert http.delete("/v1/audio/voices/narrator").status_code == 404


def test_a_client_that_hangs_up_aborts_the_replica_request(cluster):
    url, http, log = cluster
    aborted = sum(_outcomes(http, "abort").values())
    body = {"input": LONG_TEXT, "max_new_tokens": 400, "min_new_tokens": 400,
            "response_format": "pcm", "stream": True}
    with httpx.stream("POST", f"{url}/v1/audio/speech", json=body, timeout=60) as response:
        assert response.status_code == 200
        next(response.iter_raw())  # first audio, then hang up
    wait_for(lambda: sum(_outcomes(http, "abort").values()) == aborted + 1, 60, "the abort", log)
    wait_for(lambda: all(r["in_flight"] == 0 for r in _replicas(http)), 10, "nothing in flight", log)


def _outcomes(http: httpx.Client, outcome: str) -> dict[str, float]:
    counts = {}
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("higgs_serve_requests_total{") and f'outcome="{outcome}"' in line:
            counts[line.split('replica="')[1].split('"')[0]] = float(line.split()[-1])
    return counts
