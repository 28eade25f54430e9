"""The API key through the front end (issue 52): every spelling of a target answered as the
single server answers it (tests/server/test_auth_targets.py, the same table), the WebSocket
route too, and the control plane keeping the key on its own socket. The real front end in a
thread over a stand-in replica."""

from __future__ import annotations

import json

import httpx
import pytest
from fastapi import FastAPI, WebSocket
from fastapi.responses import JSONResponse, PlainTextResponse
from websockets.sync.client import connect

from support.auth_cases import KEY, check_targets, check_websocket_targets
from support.frontend_thread import front_end_over, stand_in_app


def _replica_app() -> FastAPI:
    app = stand_in_app()

    @app.get("/v1/models")
    async def models():
        return JSONResponse({"object": "list", "data": [{"id": "stand-in"}]})

    @app.post("/v1/audio/speech")
    async def speech():
        return PlainTextResponse("\x00" * 960, media_type="audio/pcm")

    @app.websocket("/v1/audio/speech/stream")
    async def stream(ws: WebSocket):
        await ws.accept()
        await ws.send_text(json.dumps({"type": "echo", "first": await ws.receive_text()}))
        await ws.close()

    return app


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    work = tmp_path_factory.mktemp("relay_auth")
    with front_end_over(_replica_app(), work, api_key=KEY) as (url, _):
        yield url, work


def test_every_spelling_of_a_target_needs_the_key(keyed):
    url, _ = keyed
    check_targets(url)


def test_the_websocket_route_needs_the_key_however_spelled(keyed):
    url, _ = keyed
    check_websocket_targets(url)
    ws = url.replace("http://", "ws://")
    for path in (f"/v1/audio/speech/stream?api_key={KEY}", f"/%76%31/audio/speech/stream?api_key={KEY}"):
        with connect(ws + path) as session:  # with it, the session reaches the replica
            session.send('{"type": "session.config"}')
            assert json.loads(session.recv(timeout=5))["type"] == "echo"


def test_the_control_plane_keeps_the_key_on_its_own_socket(keyed):
    """Nothing reaches the control plane but the relay, and it still checks the key itself
    (the same policy), so a relay that passed a request on by mistake gives nothing away."""
    _, work = keyed
    control = httpx.Client(transport=httpx.HTTPTransport(uds=str(work / "control.sock")),
                           base_url="http://frontend", timeout=10)
    for path in ("/v1/audio/voices", "/%76%31/audio/voices", "/v1/models"):
        assert control.get(path).status_code == 401, path
    assert control.get("/v1%2Faudio/voices").status_code == 400
    assert control.get("/health").status_code == 200
    authorized = control.get("/v1/audio/voices", headers={"authorization": f"Bearer {KEY}"})
    assert authorized.status_code == 200
