"""The shutdown's abort (ServerState.abort_in_flight) reaches every request path and each path
says so: nothing cut short by the server is answered as a complete recording."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import httpx
import pytest
import websockets
from fake_engine import FakeEngine, fake_deploy
from live_server import fake_settings, start_threaded_server

from higgs_serve.engine.core import EngineHooks
from higgs_serve.server.run import long_form
from higgs_serve.server.app import build_app
from higgs_serve.server.routers import speech_batch
from higgs_serve.server.schemas import SpeechBatchRequest, SpeechRequestBody
from higgs_serve.server.run.speech_run import admit_plan

SENTENCES = "One sentence here. Another one there. A third one follows."


def _state(tmp_path):
    engine = FakeEngine(deploy=fake_deploy(max_tokens=2000))
    state = build_app(engine, fake_settings(tmp_path, segment_max_chars=20,
                                            max_input_chars=500)).state.server
    asyncio.run(engine.start())
    state.engine_started = True
    return state


def _sse_types(chunks: list[bytes]) -> list[str]:
    lines = b"".join(chunks).decode().splitlines()
    return [json.loads(line[6:])["type"] for line in lines if line.startswith("data: ")]


def test_long_form_aborted_between_segments_is_not_answered_as_complete(tmp_path):
    """The grace period ending after a segment finished and before the next started: the SSE
    stream ends with speech.audio.error (it used to end with speech.audio.done, finish_reason
    "stop", the rest of the input never spoken) and the request counts "abort" as a single
    request's does (it was counted "error")."""
    state = _state(tmp_path)
    body = SpeechRequestBody(input=SENTENCES, response_format="pcm", stream_format="sse")
    segments = asyncio.run(long_form.plan_segments(body.input, state.settings))
    assert len(segments) == 3

    async def run() -> list[bytes]:
        plan = await admit_plan(body, state)
        chain = long_form.LongFormRun(state, plan, segments, time.perf_counter())
        await chain.start()
        out = []
        async for data in long_form._sse(chain, state):
            out.append(data)
            if b"speech.segment.done" in data and len(out) < 100:
                state.abort_in_flight()  # between segment 0 and segment 1
        return out

    types = _sse_types(asyncio.run(run()))
    assert types.count("speech.segment.done") == 1
    assert types[-1] == "speech.audio.error"
    assert state.gate.in_flight == 0 and not state.generations
    assert state.metrics.requests.labels("abort")._value.get() == 1


class _ChunkedFileEngine(FakeEngine):
    """File requests in several chunks, as the real engine decodes them (the fake sends one)."""

    def generate(self, request):
        return super().generate(replace(request, stream=True))


def test_batch_item_aborted_mid_way_is_an_error_not_a_success(tmp_path):
    """An item the shutdown aborts after its first audio is that item's 503 shutting_down (as a
    single file request's is), not a "success" carrying the partial audio."""
    engine = _ChunkedFileEngine(deploy=fake_deploy(max_tokens=2000))
    state = build_app(engine, fake_settings(tmp_path)).state.server
    asyncio.run(engine.start())
    state.engine_started = True
    # the first fake step: abort everything in flight; its chunk still arrives (audio started)
    engine.hooks = EngineHooks(on_step=lambda *_: state.abort_in_flight())

    body = SpeechBatchRequest(items=[{"input": "a sentence long enough for several chunks"}])
    batch = speech_batch._Batch(state, body, time.perf_counter())
    item = asyncio.run(batch._run_item(0, body.items[0]))
    result = item.result
    assert result.status == "error" and item.file is None, result
    assert (result.status_code, result.code) == (503, "shutting_down")
    assert state.gate.in_flight == 0 and not state.generations
    assert state.metrics.requests.labels("abort")._value.get() == 1


HELD_LONG_FORM = "HOLD on here. " + SENTENCES  # segment 0 ("HOLD on here.") waits in the fake


def _wait_until(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.fixture
def held_server(tmp_path):
    engine = FakeEngine(deploy=fake_deploy(max_tokens=2000))
    live = start_threaded_server(engine, fake_settings(tmp_path, segment_max_chars=20,
                                                       max_input_chars=500))
    engine.hold.clear()
    yield live, engine
    engine.hold.set()
    live.stop()


def test_long_form_client_leaving_while_queued_frees_its_slot(held_server):
    """A long-form request whose client hangs up before the first audio is aborted at once and
    counted "abort", as a single request is (it held its slot until its first audio)."""
    live, engine = held_server
    state = live.app.state.server
    host, port = live.url.removeprefix("http://").split(":")
    payload = json.dumps({"input": HELD_LONG_FORM, "response_format": "pcm"}).encode()
    with socket.create_connection((host, int(port))) as client:
        client.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: "
                       b"application/json\r\n" + f"Content-Length: {len(payload)}\r\n\r\n".encode()
                       + payload)
        _wait_until(lambda: state.gate.in_flight == 1 and engine.requests)
    _wait_until(lambda: state.gate.in_flight == 0)
    assert engine.aborted == [engine.requests[0].request_id]
    assert state.metrics.requests.labels("abort")._value.get() == 1


def test_long_form_queued_past_the_grace_period_is_a_503(held_server):
    """The shutdown's abort reaching a long-form request still queued: an OpenAI-shaped 503
    shutting_down, as a single request gets (it was a 200 whose raw body was empty)."""
    live, engine = held_server
    state = live.app.state.server
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(httpx.post, f"{live.url}/v1/audio/speech", timeout=30, json={
            "input": HELD_LONG_FORM, "response_format": "pcm", "stream": True})
        _wait_until(lambda: state.generations and engine.requests)
        state.abort_in_flight()
        response = answer.result()
    assert response.status_code == 503, response.content
    assert response.json()["error"]["code"] == "shutting_down"
    assert len(engine.requests) == 1 and state.gate.in_flight == 0


def test_websocket_sessions_end_when_the_shutdown_starts(tmp_path):
    """No grace period for WebSocket sessions (uvicorn closes them with 1012 as it starts
    shutting down): the sentence being spoken is aborted and its slot freed, so a session
    never holds the shutdown up."""
    engine = FakeEngine(deploy=fake_deploy(max_tokens=20000), step_delay_s=0.05)
    live = start_threaded_server(engine, fake_settings(tmp_path, graceful_shutdown_s=30,
                                                       max_input_chars=5000), draining=True)
    state = live.app.state.server

    async def run() -> int:
        async with websockets.connect(live.url.replace("http://", "ws://")
                                      + "/v1/audio/speech/stream") as ws:
            await ws.send(json.dumps({"type": "session.config", "response_format": "pcm",
                                      "max_new_tokens": 5000}))
            await ws.send(json.dumps({"type": "input.text", "text": "x" * 2000 + "."}))
            while not isinstance(await ws.recv(), bytes):  # the sentence is being spoken
                pass
            live.server.should_exit = True
            with pytest.raises(websockets.ConnectionClosed) as closed:
                while True:
                    await ws.recv()
            return closed.value.rcvd.code

    assert asyncio.run(run()) == 1012
    live.thread.join(timeout=10)
    assert not live.thread.is_alive()  # well inside the 30 s grace period
    assert len(engine.aborted) == 1 and state.gate.in_flight == 0


def test_a_websocket_client_that_stops_reading_loses_its_slot(tmp_path):
    """--send-timeout-s bounds WebSocket sends as it bounds HTTP response writes: a client that
    reads nothing has its sentence aborted and its slot freed after the timeout (the send
    waited forever, holding both)."""
    engine = FakeEngine(deploy=fake_deploy(max_tokens=20000))
    live = start_threaded_server(engine, fake_settings(tmp_path, send_timeout_s=1.0,
                                                       max_input_chars=5000))
    state = live.app.state.server
    host, port = live.url.removeprefix("http://").split(":")

    async def run() -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, int(port)))
        ws = await websockets.connect(f"ws://{host}:{port}/v1/audio/speech/stream", sock=sock,
                                      max_queue=1)
        await ws.send(json.dumps({"type": "session.config", "response_format": "pcm",
                                  "max_new_tokens": 10000}))
        await ws.send(json.dumps({"type": "input.text", "text": "x" * 4900 + "."}))  # 19 MB
        deadline = time.monotonic() + 10
        while not engine.aborted:  # reading nothing
            assert time.monotonic() < deadline, "the stalled session kept its slot"
            await asyncio.sleep(0.05)
        ws.transport.abort()

    try:
        asyncio.run(run())
        _wait_until(lambda: state.gate.in_flight == 0)
    finally:
        live.stop()
