"""Encoder processes that stop answering or die, through the HTTP surfaces (fake engine, real
uvicorn, two real encoder processes, --worker-timeout-s 1): a SIGSTOPped process is timed out,
its responses end cleanly (a raw stream truncated, SSE with an `encoder_failed` event), a file
(none of whose bytes has left) is retried on the other process and whole (issue 61: no 500),
a file whose retry fails too is a 503 with Retry-After, the others finish, no new response goes
to it, and it is replaced; a killed process logs one line per response and one for itself,
never a traceback (issue 52)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import signal
import time

import httpx
import numpy as np
import pytest
import soundfile as sf
from fake_engine import FakeEngine, fake_audio, fake_deploy
from live_server import assigned_streams, fake_settings, metric, start_threaded_server, until
from server_log import server_log
from support.decoders import av_decode

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
            # their first bytes out (one would else be retried whole: the test after the next)
            await asyncio.sleep(0.3)
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


async def _stop_an_idle_process(pool):
    """Both processes up and idle, stop the first: (it, the restarts before)."""
    await until(lambda: len(pool.pids()) == 2 and assigned_streams(pool) == 0, WAIT_S)
    restarts = pool.restarts
    first = pool._processes[0]
    os.kill(first.pid, signal.SIGSTOP)
    return first, restarts


def test_a_file_on_a_stopped_process_is_retried_on_the_other_and_whole(server):
    """An idle process is stopped: the next file (the fake engine's 25 frames) is assigned to it
    (it owes nothing yet) and times out; none of its bytes has left, so it is retried on the
    other process and answered whole (issue 61: before, a 500); the one after it goes to the
    other process at once."""
    pool = server.app.state.server.encode_pool
    short = {**BODY, "max_new_tokens": 25, "min_new_tokens": 25, "stream": False, "response_format": "aac"}

    async def run():
        first, restarts = await _stop_an_idle_process(pool)
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            retried = asyncio.ensure_future(client.post("/v1/audio/speech", json=short))
            await until(lambda: first.streams == 1, WAIT_S)
            await until(lambda: first.silent_s(time.monotonic()) > TIMEOUT_S / 4, WAIT_S)
            served = await client.post("/v1/audio/speech", json=short)
            retried = await retried
            await until(lambda: pool.restarts == restarts + 1, WAIT_S)
        return retried, served

    with server_log() as records:
        retried, served = asyncio.run(run())
    for answer in (retried, served):
        assert answer.status_code == 200 and answer.content[:2] == b"\xff\xf1"  # an ADTS frame
        assert int(answer.headers["content-length"]) == len(answer.content)
        assert abs(av_decode(answer.content, "aac", 24000).size - 25 * 960) < 2048
    assert retried.content == served.content  # the same audio, encoded whole on the other process
    lines = [r.getMessage() for r in records if "retrying its response on another encoder process" in r.getMessage()]
    assert len(lines) == 1 and not [r for r in records if r.exc_info]


def test_a_stream_whose_process_stops_before_its_first_byte_is_retried_and_whole(server):
    """A raw mp3 stream assigned to a process stopped while idle: its first chunk is never
    answered, none of its bytes has left, so it is retried on the other process and read to its
    end, as long as the same stream made without a failure."""
    pool = server.app.state.server.encode_pool

    async def run():
        first, restarts = await _stop_an_idle_process(pool)
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            retried = await _raw(client, "mp3")
            await until(lambda: pool.restarts == restarts + 1 and len(pool.pids()) == 2, WAIT_S)
            await until(lambda: assigned_streams(pool) == 0, WAIT_S)
            plain = await _raw(client, "mp3")
        return retried, plain

    with server_log() as records:
        retried, plain = asyncio.run(run())
    assert retried == plain and retried[0] == "ok"
    assert len([r for r in records if "retrying its response" in r.getMessage()]) == 1


def test_files_on_a_process_stopped_mid_file_are_retried_whole_and_streams_end_cleanly(server):
    """Issue 61's acceptance: two files half made and two streams playing, assigned in turn to
    the two processes (flac and the raw stream on the first); the first is stopped. No response
    is a 500: its file is replayed on the other process from the audio it had sent (kept until
    the file is finished) and is whole, its header stating its length; its stream, whose bytes
    had left, ends cut (the clear way: no last chunk); the other process's finish whole."""
    pool = server.app.state.server.encode_pool
    server.engine.file_chunk_frames = 5  # files made window by window, as the real engine's

    async def file(client, fmt):
        return await client.post("/v1/audio/speech", json={**BODY, "response_format": fmt, "stream": False})

    async def run():
        await until(lambda: len(pool.pids()) == 2 and assigned_streams(pool) == 0, WAIT_S)
        first, second = pool._processes
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            tasks = []
            for job in [lambda: file(client, "flac"), lambda: file(client, "mp3"),
                        lambda: _raw(client, "mp3"), lambda: _sse(client, "opus")]:
                tasks.append(asyncio.ensure_future(job()))
                await until(lambda: assigned_streams(pool) == len(tasks), WAIT_S)
            await asyncio.sleep(1.0)  # a quarter of their audio made and sent to the processes
            os.kill(first.pid, signal.SIGSTOP)
            return await asyncio.wait_for(asyncio.gather(*tasks), 60)

    with server_log() as records:
        try:
            flac, mp3, raw, sse = asyncio.run(run())
        finally:
            server.engine.file_chunk_frames = None
    for answer in (flac, mp3):
        assert answer.status_code == 200, answer.text
        assert int(answer.headers["content-length"]) == len(answer.content)
    info = sf.info(io.BytesIO(flac.content))  # STREAMINFO's total samples: the whole file
    assert info.frames == FRAMES * 960
    assert np.array_equal(sf.read(io.BytesIO(flac.content), dtype="int16")[0],
                          np.round(np.clip(fake_audio(5, 0, FRAMES), -1, 1) * 32767).astype(np.int16))
    assert abs(av_decode(mp3.content, "mp3", 24000).size - FRAMES * 960) < 1152
    assert raw[0] == "cut" and sse == ("speech.audio.done", "")
    retried = [r.getMessage() for r in records if "retrying its response" in r.getMessage()]
    assert len(retried) == 1, retried  # the stopped process's file
    assert not [r for r in records if r.exc_info]


def test_a_file_whose_retry_fails_too_is_a_503_with_retry_after(server):
    """Both processes stopped: the file times out on one, is retried on the other, times out
    again: a 503 in OpenAI's shape with Retry-After (the server's failure, not the request's)."""
    pool = server.app.state.server.encode_pool
    short = {**BODY, "max_new_tokens": 25, "min_new_tokens": 25, "stream": False, "response_format": "mp3"}

    async def run():
        await until(lambda: len(pool.pids()) == 2 and assigned_streams(pool) == 0, WAIT_S)
        restarts = pool.restarts
        for process in pool._processes:
            os.kill(process.pid, signal.SIGSTOP)
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            failed = await client.post("/v1/audio/speech", json=short)
        await until(lambda: pool.restarts == restarts + 2 and len(pool.pids()) == 2, 2 * WAIT_S)
        return failed

    failed = asyncio.run(run())
    assert failed.status_code == 503 and failed.headers["Retry-After"] == "1"
    assert failed.json()["error"] == {"message": "encoding the audio failed on the server; retry the request",
                                      "type": "server_error", "param": None, "code": "encoder_failed"}


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
    assert not [r for r in records if r.exc_info]
    lines = [r.getMessage() for r in records if r.levelno >= logging.WARNING]
    # the victim's responses (every other one) end, each with one line; one whose codec had not
    # yet given its first bytes (a loaded host) is retried whole instead, with one line
    retried = [m for m in lines if "retrying its response on another encoder process" in m]
    assert len(failed) + len(retried) == 3, (results, lines)
    per_response = [m for m in lines if "ended early" in m or "response encoding failed" in m]
    assert len(per_response) == len(failed), lines
    assert len([m for m in lines if f"encoder process {victim} exited" in m]) == 1
    # uvicorn closes each cut stream with one line of its own; nothing else is logged
    others = [m for m in lines if m not in per_response + retried and f"encoder process {victim}" not in m
              and m != "ASGI callable returned without completing response."]
    assert others == []
