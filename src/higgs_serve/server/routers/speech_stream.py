"""WS /v1/audio/speech/stream: streamed text in, speech out, sentence by sentence.

The protocol (vllm-omni's "Streaming Text Input", with sglang-omni's variant behind
`protocol`; docs/api.md, "WebSocket streaming"):

    client: session.config {REST fields + stream_audio, audio_transport, protocol}
            input.text {text}   input.flush   input.done   session.close
    server: [session.configured]  audio.start  <binary audio> | audio.chunk  audio.done
            session.done (per utterance)  error

Auth: with --api-key, `Authorization: Bearer <key>` or the `api_key` query parameter; a wrong or
missing key gets an `error` event and close code 1008 (server/auth.py, before this route). A
server still warming up (or whose engine died) answers `error` and close code 1013. How a session ends: server/websocket/session.py.
"""

from __future__ import annotations

from fastapi import APIRouter, WebSocket

from higgs_serve.server.run import speech_run
from higgs_serve.server.state import ServerState
from higgs_serve.server.websocket.session import CLOSE_TRY_AGAIN, Ending, SpeechStreamSession

router = APIRouter(tags=["audio"])


@router.websocket("/v1/audio/speech/stream")
async def speech_stream(ws: WebSocket) -> None:
    state: ServerState = ws.app.state.server
    # a session is a stream: on a signing server the upgrade carries the manifest's claim
    claim = speech_run.claim_headers(state)
    await ws.accept(headers=[(k.lower().encode(), v.encode()) for k, v in claim.items()])
    session = SpeechStreamSession(ws, state)
    if not state.engine_ready():
        dead = state.engine_dead()
        await session.end(Ending.failed(
            "engine_dead" if dead else "not_ready",
            "the engine has stopped; the server must be restarted" if dead
            else "the engine is still warming up; retry shortly", CLOSE_TRY_AGAIN))
        return
    state.metrics.ws_sessions.inc()
    try:
        await session.run()
    finally:
        state.metrics.ws_sessions.dec()

