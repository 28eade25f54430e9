"""One WebSocket speech session: text arrives in pieces, sentences are spoken as they complete.

Two tasks per session. The reader takes client messages, feeds the incremental segmenter
(text/incremental.py) and queues complete sentences; the speaker takes queued sentences one at a
time and speaks them through one `LongFormSession` (engine/long_form.py), so every sentence of a
session is one voice, seeds go seed + k, and joins get the same seam ramp as a long-form HTTP
response. A sentence starts the moment it is complete, while the client is still sending.

Errors in a message (bad JSON, unknown type, text before config, an oversize message, a refused
sentence) are `error` events; the session goes on. The session ends on session.close (and with
protocol sglang-omni on input.done): what is buffered is spoken, then session.done, then close.
A disconnect cancels the speaker at once, which aborts its engine request. An idle session (no
message for ws_idle_timeout_s while nothing is queued or speaking) gets an `error` and is closed.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time

from starlette.websockets import WebSocket, WebSocketDisconnect

from higgs_serve.engine.long_form import LongFormSession, SegmentAudio, SegmentDone, SegmentStarted
from higgs_serve.errors import EngineDeadError, HiggsServeError
from higgs_serve.server import speech_run
from higgs_serve.server.audio_out import AudioOut
from higgs_serve.server.errors import ApiError, to_api_error
from higgs_serve.server.long_form import max_audio_samples
from higgs_serve.server.state import ServerState
from higgs_serve.server.ws_config import SessionConfig, parse_session_config
from higgs_serve.text import IncrementalSegmenter, Segment

CLOSE_NORMAL = 1000
CLOSE_POLICY = 1008  # bad API key
CLOSE_TRY_AGAIN = 1013  # engine not ready


class _Ended(Exception):
    """The session is over (client gone, fatal engine error)."""


class SpeechStreamSession:
    def __init__(self, ws: WebSocket, state: ServerState):
        self.ws = ws
        self.state = state
        self.config: SessionConfig | None = None
        self.voice: LongFormSession | None = None
        self.segmenter = IncrementalSegmenter(state.settings.segment_max_chars)
        self.queue: asyncio.Queue[Segment | None] = asyncio.Queue()
        self.queued_chars = 0  # text of sentences queued and not yet spoken
        self.speaking = False
        self.num_sentences = 0

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> None:
        speaker = asyncio.create_task(self._speak_loop())
        try:
            ending = await self._read_loop()
        except _Ended:
            ending = False
        if not ending or speaker.done():
            speaker.cancel()
            await asyncio.gather(speaker, return_exceptions=True)
            return
        await self.queue.put(None)  # speak what is queued, then finish
        try:
            await speaker
            await self._send_json(self._session_done())
            await self.ws.close(CLOSE_NORMAL)
        except _Ended:
            pass
        finally:
            if not speaker.done():
                speaker.cancel()

    async def _read_loop(self) -> bool:
        """True: end gracefully (session.close, sglang input.done); False: drop at once."""
        idle_s = self.state.settings.ws_idle_timeout_s
        while True:
            try:
                message = await asyncio.wait_for(self.ws.receive(), timeout=idle_s)
            except TimeoutError:
                if self.speaking or not self.queue.empty():
                    continue
                await self.send_error("the session was idle too long and is closed", code="idle_timeout")
                await self._flush()  # anything buffered is still spoken
                return True
            if message["type"] == "websocket.disconnect":
                return False
            if await self._handle(message):
                return True

    # ------------------------------------------------------------------ messages
    async def _handle(self, message: dict) -> bool:
        """Handle one client message; True when the session should end gracefully."""
        text = message.get("text")
        if text is None:
            await self.send_error("binary messages are not accepted: send JSON text messages",
                                  code="invalid_message")
            return False
        limit = self.state.settings.max_input_chars
        if len(text) > limit:
            await self.send_error(f"message is {len(text)} characters; the limit is {limit}",
                                  code="message_too_large")
            return False
        try:
            event = json.loads(text)
        except ValueError:
            await self.send_error("message is not valid JSON", code="invalid_json")
            return False
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            await self.send_error("message must be a JSON object with a string 'type'",
                                  code="invalid_message", param="type")
            return False
        handler = self._HANDLERS.get(event["type"])
        if handler is None:
            await self.send_error(f"unknown message type {event['type']!r}; expected one of "
                                  f"{', '.join(self._HANDLERS)}", code="unknown_type", param="type")
            return False
        return await handler(self, event)

    async def _on_config(self, event: dict) -> bool:
        if self.config is not None:
            await self.send_error("the session is already configured", code="already_configured")
            return False
        # Planning may fetch, decode and encode a reference clip: as for a REST request, only
        # with an admission slot, held while the plan is made (each sentence takes its own later).
        state = self.state
        if not await self._take_slot("send session.config again later"):
            return False
        try:
            config = await parse_session_config(event, state)
        except (ApiError, HiggsServeError) as error:
            state.metrics.count("invalid")
            await self._error_from(error)
            return False
        finally:
            state.gate.release()
        self.config = config
        self.voice = LongFormSession(self.state.engine.generate, config.plan.request,
                                     max_audio_samples(self.state))
        if config.options.protocol == "sglang-omni":
            await self._send_json({"type": "session.configured",
                                   "sample_rate": config.plan.sample_rate_hz,
                                   "format": config.plan.response_format})
        return False

    async def _on_text(self, event: dict) -> bool:
        if self.config is None:
            await self.send_error("send session.config before input.text", code="not_configured")
            return False
        text = event.get("text")
        if not isinstance(text, str):
            await self.send_error("input.text needs a string 'text'", code="invalid_message",
                                  param="text")
            return False
        limit = self.state.settings.max_input_chars
        if self.segmenter.pending_chars + self.queued_chars + len(text) > limit:
            await self.send_error(f"more than {limit} characters are waiting to be spoken; this "
                                  "text was dropped: send more once audio has caught up",
                                  code="input_backlog", param="text")
            return False
        await self._enqueue(self.segmenter.feed(text))
        return False

    async def _on_done(self, event: dict) -> bool:
        if self.config is None:
            await self.send_error("send session.config before input.done", code="not_configured")
            return False
        await self._flush()
        return self.config.options.protocol == "sglang-omni"

    async def _on_close(self, event: dict) -> bool:
        await self._flush()
        return True

    _HANDLERS = {"session.config": _on_config, "input.text": _on_text, "input.done": _on_done,
                 "session.close": _on_close}

    async def _flush(self) -> None:
        await self._enqueue(self.segmenter.flush())

    async def _enqueue(self, segments: list[Segment]) -> None:
        for segment in segments:
            self.queued_chars += len(segment.text)
            await self.queue.put(segment)

    # ------------------------------------------------------------------ speaking
    async def _speak_loop(self) -> None:
        while (segment := await self.queue.get()) is not None:
            self.speaking = True
            try:
                await self._speak(segment)
            finally:
                self.speaking = False
                self.queued_chars -= len(segment.text)

    async def _take_slot(self, consequence: str) -> bool:
        """An admission slot (the caller releases it), or a `queue_full` error event saying
        `consequence` and False; counted "rejected" as a REST request would be."""
        gate = self.state.gate
        if gate.try_acquire():
            return True
        self.state.metrics.count("rejected")
        await self.send_error(f"the server is at capacity ({gate.capacity} requests in flight); {consequence}",
                              code="queue_full")
        return False

    async def _speak(self, segment: Segment) -> None:
        state = self.state
        if self.voice.length_capped:
            await self.send_error("this session reached the audio limit (max_audio_s); the text "
                                  "was not spoken", code="audio_limit")
            return
        if not await self._take_slot("this sentence was not spoken"):
            return
        ready_s = time.perf_counter()
        speech = self.voice.speak(segment)
        record = _SegmentRecord()
        try:
            async for event in speech:
                await self._send_event(event, record, ready_s)
        except HiggsServeError as error:
            record.failure = speech_run.failure_label(error)  # as a REST request's start
            await self._error_from(error)
            if isinstance(error, EngineDeadError):
                raise _Ended() from error
        except (asyncio.CancelledError, _Ended):
            record.failure = "abort"  # the client left (or the session ended) mid-sentence
            raise
        finally:
            await speech.aclose()  # aborts the engine request if the sentence is unfinished
            if record.out is not None:  # an unfinished sentence's encoder pipeline
                record.out.release()
            state.gate.release()
            record.account(state)

    async def _send_event(self, event, record: _SegmentRecord, ready_s: float) -> None:
        options, plan = self.config.options, self.config.plan
        if isinstance(event, SegmentStarted):
            self.num_sentences += 1
            record.out = speech_run.audio_out(plan, self.state)  # each sentence its own file
            await self._send_json({
                "type": "audio.start", "sentence_index": event.index,
                "sentence_text": event.segment.text, "char_start": event.segment.start,
                "char_end": event.segment.end, "format": plan.response_format,
                "sample_rate": plan.sample_rate_hz})
        elif isinstance(event, SegmentAudio):
            record.first_audio(self.state, ready_s)
            record.pending.append(await record.out.push(event.audio))
            record.num_samples += event.audio.size
            if options.stream_audio:
                await self._send_audio(record, event.index)
        else:
            record.pending.append(await record.out.close())
            await self._send_audio(record, event.index)
            record.done = event
            await self._send_json({"type": "audio.done", "sentence_index": event.index,
                                   "total_bytes": record.num_bytes,
                                   **event.timing(self.state.engine.sample_rate_hz)})

    async def _send_audio(self, record: _SegmentRecord, index: int) -> None:
        if not record.pending:
            return
        data, record.pending = b"".join(record.pending), []
        if not data:  # nothing yet (a codec's lookahead, an empty tail)
            return
        record.num_bytes += len(data)
        if self.config.options.audio_transport == "base64":
            await self._send_json({"type": "audio.chunk", "sentence_index": index,
                                   "audio": base64.b64encode(data).decode("ascii")})
        else:
            await self._send(self.ws.send_bytes(data))

    def _session_done(self) -> dict:
        voice = self.voice
        rate = self.state.engine.sample_rate_hz
        segments = [d.timing(rate) for d in voice.done] if voice else []
        return {"type": "session.done", "total_sentences": len(segments), "segments": segments,
                "total_frames": voice.num_frames if voice else 0,
                "audio_seconds": round(voice.num_samples / rate, 6) if voice else 0.0}

    # ------------------------------------------------------------------ sending
    async def send_error(self, message: str, code: str, param: str | None = None,
                     type: str = "invalid_request_error") -> None:
        error = {"message": message, "type": type, "param": param, "code": code}
        await self._send_json({"type": "error", "message": message, "code": code,
                               "error": error})

    async def _error_from(self, error: Exception) -> None:
        api = to_api_error(error)
        await self.send_error(api.message, code=api.code or api.type, param=api.param, type=api.type)

    async def _send_json(self, payload: dict) -> None:
        await self._send(self.ws.send_text(json.dumps(payload, separators=(",", ":"))))

    async def _send(self, sending) -> None:
        """One message, within --send-timeout-s as every HTTP response write: a client that
        stops reading ends the session, which aborts its sentence and frees its slot."""
        try:
            await asyncio.wait_for(sending, self.state.settings.send_timeout_s)
        except TimeoutError as error:
            raise _Ended() from error
        except (WebSocketDisconnect, RuntimeError, OSError) as error:
            raise _Ended() from error


class _SegmentRecord:
    """One sentence's bookkeeping: audio waiting to be sent, metrics recorded once."""

    def __init__(self):
        self.pending: list[bytes] = []
        self.out: AudioOut | None = None  # the sentence's pipeline, set by its SegmentStarted
        self.num_bytes = 0
        self.num_samples = 0
        self.ttfa_recorded = False
        self.done: SegmentDone | None = None
        self.failure: str | None = None  # the outcome of a sentence that did not finish
        self._ready_s = 0.0

    def first_audio(self, state: ServerState, ready_s: float) -> None:
        if not self.ttfa_recorded:
            self.ttfa_recorded = True
            self._ready_s = ready_s
            state.metrics.ttfa_seconds.observe(time.perf_counter() - ready_s)

    def account(self, state: ServerState) -> None:
        metrics = state.metrics
        if self.done is not None:
            metrics.count(self.done.finish_reason)
            metrics.generated_frames.inc(self.done.num_frames)
        elif self.failure is not None:
            metrics.count(self.failure)
        audio_s = self.num_samples / state.engine.sample_rate_hz
        metrics.audio_seconds.inc(audio_s)
        if self.done is not None and audio_s > 0:
            metrics.rtf.observe((time.perf_counter() - self._ready_s) / audio_s)
