"""Encoder processes that stop answering or die, through the HTTP surfaces (fake engine, real
uvicorn, two real encoder processes, --worker-timeout-s 1): a SIGSTOPped process is timed out,
its responses end cleanly (a raw stream truncated, SSE with an `encoder_failed` event, a file
with a 500), the others finish, no new response goes to it, and it is replaced; a killed
process logs one line per response and one for itself, never a traceback (issue 52)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time

import httpx
import pytest
from fake_engine import FakeEngine, fake_deploy
from live_server import assigned_streams, fake_settings, metric, start_threaded_server, until
from server_log import server_log

WAIT_S = 15.0  # the longest a step of these tests waits for the pool
TIMEOUT_S = 1.0  # --worker-timeout-s
FRAMES = 400  # 80 chunks of 5 frames, 40 ms apart: ~3.2 s a response
BODY = {"input": "x" * 200, "seed": 5, "max_new_tokens": FRAMES, "min_new_tokens": FRAMES}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    engine = FakeEngine(deploy=fake_deploy(max_num_seqs=8, max_tokens=FRAMES), chunk_frames=5,
                        step_delay_s=0.04)
    live = start_threaded_server(engine, fake_settings(tmp_path_factory.mktemp("wedged"), max_queue=4,
                                                       max_input_chars=400, encode_processes=2,
                                                       worker_timeout_s=TIMEOUT_S))
    assert httpx.post(f"{live.url}/v1/audio/speech", json={"input": "hi", "response_format": "flac"},
                      timeout=30).status_code == 200  # starts the processes
    yield live
    live.stop()


async def _raw(client: httpx.AsyncClient, fmt: str) -> tuple[str, int]:
    """('ok' | 'cut', bytes) of a raw stream read to its end."""
    received = 0
    try:
        async with client.stream("POST", "/v1/audio/speech", json={**BODY, "response_format": fmt}) as r:
            assert r.status_code == 200
            async for data in r.aiter_bytes():
                received += len(data)
    except httpx.RemoteProtocolError:
        return "cut", received
    return "ok", received


async def _sse(client: httpx.AsyncClient, fmt: str) -> tuple[str, str]:
    """(last event's type, its error code or '')."""
    last = {}
    async with client.stream("POST", "/v1/audio/speech", json={
            **BODY, "response_format": fmt, "stream_format": "sse"}) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                last = json.loads(line[len("data: "):])
    return last["type"], last.get("error", {}).get("code", "")


def test_a_stopped_encoder_process_is_timed_out_its_responses_end_and_it_is_replaced(server):
    pool = server.app.state.server.encode_pool

    async def run():
        await until(lambda: len(pool.pids()) == 2, WAIT_S)
        first, second = pool._processes
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            # four streams, assigned alternately (the least loaded; a tie to the first): a raw
            # one and an SSE one on each process
            tasks = []
            for kind, fmt in [(_raw, "mp3"), (_raw, "mp3"), (_sse, "opus"), (_sse, "opus")]:
                tasks.append(asyncio.ensure_future(kind(client, fmt)))
                await until(lambda: assigned_streams(pool) == len(tasks), WAIT_S)
            assert first.streams == second.streams == 2
            stopped = first.pid
            os.kill(stopped, signal.SIGSTOP)
            stopped_at = time.monotonic()
            results = await asyncio.wait_for(asyncio.gather(*tasks), 30)
            ended_s = time.monotonic() - stopped_at
            await until(lambda: pool.restarts == 1 and len(pool.pids()) == 2, WAIT_S)
            return stopped, results, ended_s

    with server_log() as records:
        stopped, results, ended_s = asyncio.run(run())
    raw_cut, raw_ok, sse_failed, sse_ok = results
    assert raw_cut[0] == "cut" and raw_ok[0] == "ok" and raw_ok[1] > raw_cut[1]
    assert sse_failed == ("speech.audio.error", "encoder_failed") and sse_ok == ("speech.audio.done", "")
    assert ended_s < 2 * FRAMES / 5 * 0.04 + 3 * TIMEOUT_S  # nobody waited for a resume
    assert stopped not in pool.pids() and not os.path.exists(f"/proc/{stopped}")  # killed, reaped
    assert not [r for r in records if r.exc_info], [r.getMessage() for r in records if r.exc_info]
    killed = [r.getMessage() for r in records if f"encoder process {stopped} answered nothing" in r.getMessage()]
    assert len(killed) == 1
    with httpx.Client(base_url=server.url) as http:
        assert metric(http, "higgs_serve_encoder_restarts_total") == 1
        assert metric(http, "higgs_serve_encoder_streams") == 0


def test_a_file_on_a_stopped_process_is_a_500_and_the_next_goes_to_the_other(server):
    """An idle process is stopped: the next file (one chunk, the fake engine's whole audio) is
    assigned to it (it owes nothing yet), times out as a 500; the one after it, sent while the
    stopped process is silent, goes to the other process and is whole."""
    pool = server.app.state.server.encode_pool
    short = {**BODY, "max_new_tokens": 25, "min_new_tokens": 25, "stream": False, "response_format": "aac"}

    async def run():
        await until(lambda: len(pool.pids()) == 2 and assigned_streams(pool) == 0, WAIT_S)
        restarts = pool.restarts
        first = pool._processes[0]
        os.kill(first.pid, signal.SIGSTOP)
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            failed = asyncio.ensure_future(client.post("/v1/audio/speech", json=short))
            await until(lambda: first.streams == 1, WAIT_S)
            await until(lambda: first.silent_s(time.monotonic()) > TIMEOUT_S / 4, WAIT_S)
            served = await client.post("/v1/audio/speech", json=short)
            failed = await failed
            await until(lambda: pool.restarts == restarts + 1, WAIT_S)
        return failed, served

    failed, served = asyncio.run(run())
    assert failed.status_code == 500 and failed.json()["error"]["code"] == "encoder_failed"
    assert served.status_code == 200 and served.content[:2] == b"\xff\xf1"  # an ADTS frame


def test_a_killed_encoder_process_logs_one_line_per_response_and_no_traceback(server):
    pool = server.app.state.server.encode_pool

    async def run():
        await until(lambda: len(pool.pids()) == 2, WAIT_S)
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            tasks = []
            for kind, fmt in [(_raw, "mp3"), (_raw, "aac"), (_raw, "mp3"), (_raw, "aac"),
                              (_sse, "opus"), (_sse, "opus")]:
                tasks.append(asyncio.ensure_future(kind(client, fmt)))
                await until(lambda: assigned_streams(pool) == len(tasks), WAIT_S)
            victim = pool._processes[0].pid
            os.kill(victim, signal.SIGKILL)
            return victim, await asyncio.wait_for(asyncio.gather(*tasks), 30)

    with server_log() as records:
        victim, results = asyncio.run(run())
    failed = [r for r in results if r[0] in ("cut", "speech.audio.error")]
    assert len(failed) == 3  # the victim's: every other response
    assert not [r for r in records if r.exc_info]
    lines = [r.getMessage() for r in records if r.levelno >= logging.WARNING]
    per_response = [m for m in lines if "ended early" in m or "response encoding failed" in m]
    assert len(per_response) == 3, lines
    assert len([m for m in lines if f"encoder process {victim} exited" in m]) == 1
    # uvicorn closes each cut stream with one line of its own; nothing else is logged
    others = [m for m in lines if m not in per_response and f"encoder process {victim}" not in m
              and m != "ASGI callable returned without completing response."]
    assert others == []
