"""One WebSocket speech session: text arrives in pieces, sentences are spoken as they complete.

Two tasks per session. The reader takes client messages, feeds the incremental segmenter
(text/incremental.py) and queues complete sentences and the ends of utterances; the speaker takes
them one at a time and speaks each sentence through one `LongFormSession` (engine/long_form.py),
so every sentence of a session is one voice, seeds go seed + k, and joins get the same seam ramp
as a long-form HTTP response. A sentence starts the moment it is complete, while the client is
still sending.

Utterances (vllm-omni's contract): `input.done` ends one. What is buffered is spoken, then
`session.done` (with its `utterance_index`) is sent and the connection stays open for the next
utterance. `input.flush` speaks what is buffered and goes on. `session.close` (and, with protocol
sglang-omni, `input.done`) ends the session: what is buffered is spoken, then `session.done`,
then close 1000.

Word timestamps (`word_timestamps` in session.config): each sentence has its own tap
(server/last_mile/word_timestamps.py) fed its audio through its AudioOut; once the sentence's audio is
sent, its alignment runs in an aligner process while the next sentence is already generating.
The trailing `audio.chunk` with the sentence's timestamps and its `audio.done` go out when the
words are ready, and always before the next sentence's `audio.start` or the utterance's
`session.done` (vllm-omni's order), so audio never waits on the aligner except when the next
sentence's first audio comes before the previous sentence's words.

Errors in a message (bad JSON, unknown type, text before config, an oversize message, a refused
sentence) are `error` events; the session goes on. A session ends exactly one way, within a
bounded time whatever the client does (docs/api.md, "How a session ends"):
  - `session.done`, then close 1000 (session.close; sglang-omni's input.done);
  - an `error` event, then a close code: idle (no message for ws_idle_timeout_s while nothing is
    queued or speaking: `idle_timeout`, 1000), a client that stopped reading (a message not sent
    within send_timeout_s: `send_timeout`, 1008), the engine stopped (`engine_dead`, 1011);
  - nothing at all when the client disconnected (its sentence is aborted at once).
The reader and the speaker are watched together: whichever ends first ends the session, so a
speaker that died (its client stopped reading) is noticed even with sentences still queued.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, replace

from starlette.websockets import WebSocket, WebSocketDisconnect

from higgs_serve.engine.long_form import LongFormSession, SegmentAudio, SegmentDone, SegmentStarted
from higgs_serve.engine.speech import SpeechRequest
from higgs_serve.errors import EngineDeadError, HiggsServeError
from higgs_serve.server.run import speech_run
from higgs_serve.server.last_mile.audio_out import AudioOut
from higgs_serve.server.last_mile.playback_meter import PlaybackMeter
from higgs_serve.server.errors import ApiError, to_api_error
from higgs_serve.server.limits.json_limits import JsonShapeError, JsonTooDeepError, check_json_shape
from higgs_serve.server.run.generation import playback_meter
from higgs_serve.server.run.long_form import max_audio_samples
from higgs_serve.server.schemas import unicode_text
from higgs_serve.server.state import ServerState
from higgs_serve.server.last_mile.word_timestamps import WordTimestampTap, words_json
from higgs_serve.server.websocket.transport import TRANSPORTS, AudioTransport
from higgs_serve.server.websocket.config import SessionConfig, parse_session_config, transport_name
from higgs_serve.text import IncrementalSegmenter, Segment

logger = logging.getLogger(__name__)

CLOSE_NORMAL = 1000
CLOSE_POLICY = 1008  # bad API key; a client that stopped reading
CLOSE_INTERNAL = 1011  # the engine stopped
CLOSE_TRY_AGAIN = 1013  # engine not ready
# The last error event and close frame of a session ending on a fault: never waited on longer
# (a client that stopped reading would hold them forever). After a send timeout they wait up to
# send_timeout_s once more (the session's sentence is already aborted and its slot freed): a
# client that reads again in that time gets the rest of its audio, then the `send_timeout` error
# and a 1008 close, never a bare 1006 (issue 52); one that never reads again is closed after it.
FINAL_SEND_S = 1.0
UNREAD_FINAL_SEND_S = float("inf")  # capped by send_timeout_s in `end`
# Text past this many characters is segmented on a worker thread (sentencex takes about 1 s per
# million characters): the event loop is never held for more than a few milliseconds by it.
SEGMENT_ON_LOOP_CHARS = 4096
# Utterance ends (input.done) queued and not yet reached by the speaker, at most.
MAX_PENDING_UTTERANCES = 64


class _Ended(Exception):
    """A message could not be sent: the client left, or stopped reading (send timeout)."""

    def __init__(self, timed_out: bool):
        super().__init__()
        self.timed_out = timed_out


@dataclass(frozen=True)
class Ending:
    """How a session ends: an error event (or none) and a close code (None: the client left,
    nothing more is sent)."""

    close_code: int | None
    error: dict | None = None
    wait_s: float = FINAL_SEND_S  # at most, for the error event and close frame together

    @staticmethod
    def failed(code: str, message: str, close_code: int, type: str = "server_error",
               wait_s: float = FINAL_SEND_S) -> Ending:
        return Ending(close_code, error_event(message, code, type=type), wait_s)


GONE = Ending(None)
DONE = Ending(CLOSE_NORMAL)


@dataclass(frozen=True)
class _UtteranceEnd:
    """Queued by input.done / input.flush / session.close behind the sentences it ends."""

    done: bool  # send session.done (input.done, session.close); False: input.flush
    last: bool  # the session ends after it (session.close, sglang-omni's input.done)


async def _cancelled(task: asyncio.Task) -> None:
    """Cancel `task` and wait until it has ended. One cancel() is not enough on Python 3.11:
    asyncio.wait_for returns the inner result, swallowing the cancellation, when both land in
    the same loop iteration (a message already queued), and the reader would read on."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=0.05)


def error_event(message: str, code: str, param: str | None = None,
                type: str = "invalid_request_error") -> dict:
    error = {"message": message, "type": type, "param": param, "code": code}
    return {"type": "error", "message": message, "code": code, "error": error}


class SpeechStreamSession:
    def __init__(self, ws: WebSocket, state: ServerState):
        self.ws = ws
        self.state = state
        self.config: SessionConfig | None = None
        self.voice: LongFormSession | None = None
        self.audio: AudioTransport | None = None
        self.segmenter = IncrementalSegmenter(state.settings.segment_max_chars)
        self.queue: asyncio.Queue[Segment | _UtteranceEnd] = asyncio.Queue()
        self.queued_chars = 0  # text of sentences queued and not yet spoken
        self.pending_utterances = 0  # utterance ends queued and not yet reached
        self.speaking = False
        self.closing = False  # the last utterance end is queued: nothing more is accepted
        self.over = False  # the last session.done is going out: nothing more is answered
        self.utterance_index = 0  # of the utterance being spoken
        self.utterance: list[SegmentDone] = []  # its sentences spoken so far
        # word timestamps: the last sentence's trailing frame and audio.done, sent by this task
        # once its words are aligned (awaited before anything of the next sentence is sent)
        self.finishing: asyncio.Task | None = None

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> None:
        """Serve the session until it ends (module doc), then end it that one way."""
        reader = asyncio.create_task(self._read_loop())
        speaker = asyncio.create_task(self._speak_loop())
        try:
            done, _ = await asyncio.wait({reader, speaker}, return_when=asyncio.FIRST_COMPLETED)
            first = speaker if speaker in done else reader
            ending = self._ending_of(first)
        finally:  # also when the server cancels the session (shutdown)
            await asyncio.gather(_cancelled(reader), _cancelled(speaker))
            if self.finishing is not None:
                await _cancelled(self.finishing)
        other = reader if first is speaker else speaker
        if not other.cancelled() and other.exception() is not None:
            self._ending_of(other)  # failed as well before it was stopped: logged too
        await self.end(ending)

    @staticmethod
    def _ending_of(task: asyncio.Task) -> Ending:
        error = task.exception()
        if error is None:
            return task.result()
        logger.error("WebSocket speech session failed", exc_info=error)  # a bug: say so once
        return Ending.failed("internal_error", "internal server error", CLOSE_INTERNAL)

    async def end(self, ending: Ending) -> None:
        """Send the ending's error event and close frame, both within FINAL_SEND_S; a client
        that is gone or not reading changes nothing (and is never logged as a fault)."""
        if ending.close_code is None:
            return
        try:
            await asyncio.wait_for(self._send_ending(ending),
                                   min(ending.wait_s, self.state.settings.send_timeout_s))
        except (TimeoutError, WebSocketDisconnect, RuntimeError, OSError):
            pass  # the client left or stopped reading: there is no one to tell

    async def _send_ending(self, ending: Ending) -> None:
        if ending.error is not None:
            await self.ws.send_text(json.dumps(ending.error, separators=(",", ":")))
        await self.ws.close(ending.close_code)

    # ------------------------------------------------------------------ reading
    async def _read_loop(self) -> Ending:
        idle_s = self.state.settings.ws_idle_timeout_s
        try:
            while True:
                try:
                    message = await asyncio.wait_for(self.ws.receive(), timeout=idle_s)
                except TimeoutError:
                    if self.speaking or self.closing or not self.queue.empty():
                        continue  # idle only while nothing is left to speak: the speaker ends
                        # the session otherwise (done, or dead within send_timeout_s)
                    return self._idle_ending(idle_s)
                if message["type"] == "websocket.disconnect":
                    return GONE
                await self._handle(message)
        except _Ended as ended:
            return self._send_failed(ended)

    def _idle_ending(self, idle_s: float) -> Ending:
        unspoken = self.segmenter.pending_chars
        lost = f"; {unspoken} characters of unfinished text were not spoken" if unspoken else ""
        return Ending.failed("idle_timeout", f"the session was idle for {idle_s:g} s (no message "
                             f"and nothing to speak) and is closed{lost}", CLOSE_NORMAL,
                             type="invalid_request_error")

    def _send_failed(self, ended: _Ended) -> Ending:
        if not ended.timed_out:
            return GONE
        timeout_s = self.state.settings.send_timeout_s
        # the client is not reading: the event and close frame wait one more send timeout
        return Ending.failed("send_timeout", f"the client read nothing for {timeout_s:g} s; the "
                             "session is closed", CLOSE_POLICY, type="invalid_request_error",
                             wait_s=UNREAD_FINAL_SEND_S)

    async def _handle(self, message: dict) -> None:
        """One client message: acted on, or answered with an error event."""
        if self.over:
            return
        event = await self._parse(message)
        if event is None:
            return
        handler = self._HANDLERS.get(event["type"])
        if handler is None:
            await self.send_error(f"unknown message type {event['type']!r}; expected one of "
                                  f"{', '.join(self._HANDLERS)}", code="unknown_type", param="type")
            return
        if self.closing:
            await self.send_error("the session is closing (after session.close, or input.done with "
                                  "protocol sglang-omni): this message was ignored",
                                  code="session_closing", param="type")
            return
        await handler(self, event)

    async def _parse(self, message: dict) -> dict | None:
        """The message as a JSON object with a string `type`, or None after an error event.
        Its size and shape are checked before it is parsed (json_limits.py)."""
        text = message.get("text")
        if text is None:
            await self.send_error("binary messages are not accepted: send JSON text messages",
                                  code="invalid_message")
            return None
        limit = self.state.settings.max_ws_message_bytes
        if len(text) > limit:
            await self.send_error(f"message is {len(text)} characters; the limit is {limit}",
                                  code="message_too_large")
            return None
        try:
            check_json_shape(text)
            event = json.loads(text)
        except JsonShapeError as error:
            code = "invalid_json" if isinstance(error, JsonTooDeepError) else "message_too_large"
            await self.send_error(f"message is {error}; no message is that complex", code=code)
            return None
        except (ValueError, RecursionError):
            await self.send_error("message is not valid JSON", code="invalid_json")
            return None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            await self.send_error("message must be a JSON object with a string 'type'",
                                  code="invalid_message", param="type")
            return None
        return event

    # ------------------------------------------------------------------ messages
    async def _on_config(self, event: dict) -> None:
        if self.config is not None:
            await self.send_error("the session is already configured", code="already_configured")
            return
        # Planning may fetch, decode and encode a reference clip: as for a REST request, only
        # with an admission slot, held while the plan is made (each sentence takes its own later).
        state = self.state
        if not await self._take_slot("send session.config again later"):
            return
        try:
            config = await parse_session_config(event, state)
        except (ApiError, HiggsServeError) as error:
            state.metrics.count("invalid")
            await self._error_from(error)
            return
        finally:
            state.gate.release()
        self.config = config
        self.voice = LongFormSession(self._generate, config.plan.request, max_audio_samples(self.state))
        self.audio = TRANSPORTS[transport_name(config)](self._send_json, self._send_bytes,
                                                        config.plan.sample_rate_hz)
        if config.options.protocol == "sglang-omni":
            await self._send_json({
                "type": "session.configured", "session_id": config.plan.request.request_id,
                "sample_rate": config.plan.sample_rate_hz,
                "format": config.plan.response_format,
                "response_format": config.plan.response_format,
                "stream_audio": config.options.stream_audio,
                "split_granularity": config.options.split_granularity})

    def _generate(self, request: SpeechRequest):
        """The engine's `generate` for a sentence: heard as it is made (its deadlines order the
        engine's work), never refused for its first-audio budget (the session is open: it waits
        for its place, docs/api.md#over-capacity)."""
        if request.playback is not None:
            request = replace(request, playback=replace(request.playback, ttfa_budget_s=None))
        return self.state.engine.generate(request)

    async def _on_text(self, event: dict) -> None:
        if not await self._configured("input.text"):
            return
        text = event.get("text")
        if not isinstance(text, str):
            await self.send_error("input.text needs a string 'text'", code="invalid_message",
                                  param="text")
            return
        try:
            unicode_text(text)
        except ValueError as error:
            await self.send_error(f"text {error}", code="invalid_message", param="text")
            return
        limit = self.state.settings.max_input_chars
        if self.segmenter.pending_chars + self.queued_chars + len(text) > limit:
            await self.send_error(f"more than {limit} characters are waiting to be spoken; this "
                                  "text was dropped: send more once audio has caught up",
                                  code="input_backlog", param="text")
            return
        await self._enqueue(await self._segmented(self.segmenter.feed, text))

    async def _on_done(self, event: dict) -> None:
        """vllm-omni: the utterance ends (session.done) and the session stays open;
        sglang-omni: the session ends."""
        if await self._configured("input.done"):
            await self._end_utterance(_UtteranceEnd(
                done=True, last=self.config.options.protocol == "sglang-omni"))

    async def _on_flush(self, event: dict) -> None:
        if await self._configured("input.flush"):
            await self._end_utterance(_UtteranceEnd(done=False, last=False))

    async def _on_close(self, event: dict) -> None:
        await self._end_utterance(_UtteranceEnd(done=True, last=True))

    _HANDLERS = {"session.config": _on_config, "input.text": _on_text, "input.done": _on_done,
                 "input.flush": _on_flush, "session.close": _on_close}

    async def _configured(self, what: str) -> bool:
        if self.config is None:
            await self.send_error(f"send session.config before {what}", code="not_configured")
        return self.config is not None

    async def _end_utterance(self, mark: _UtteranceEnd) -> None:
        if mark.done and not mark.last and self.pending_utterances >= MAX_PENDING_UTTERANCES:
            await self.send_error(f"{MAX_PENDING_UTTERANCES} utterances are still waiting to be "
                                  "spoken; this input.done was dropped", code="input_backlog")
            return
        await self._enqueue(await self._segmented(self.segmenter.flush))
        self.closing = mark.last
        if mark.done:
            self.pending_utterances += 1
        await self.queue.put(mark)

    async def _segmented(self, segment, *args) -> list[Segment]:
        """segmenter.feed / flush, on a worker thread when there is much text (the reader
        awaits it, so the segmenter is never used by two threads at once)."""
        size = self.segmenter.pending_chars + sum(len(arg) for arg in args)
        if size <= SEGMENT_ON_LOOP_CHARS:
            return segment(*args)
        return await asyncio.to_thread(segment, *args)

    async def _enqueue(self, segments: list[Segment]) -> None:
        for segment in segments:
            self.queued_chars += len(segment.text)
            await self.queue.put(segment)

    # ------------------------------------------------------------------ speaking
    async def _speak_loop(self) -> Ending:
        try:
            while True:
                item = await self.queue.get()
                self.speaking = True  # until the item is done: the reader's idle clock waits
                try:
                    if isinstance(item, _UtteranceEnd):
                        if await self._end_of(item):
                            return DONE
                    else:
                        try:
                            await self._speak(item)
                        finally:
                            self.queued_chars -= len(item.text)
                finally:
                    self.speaking = False
        except _Ended as ended:
            return self._send_failed(ended)
        except EngineDeadError:
            return Ending.failed("engine_dead", "the engine has stopped; the server must be "
                                 "restarted", CLOSE_INTERNAL)

    async def _end_of(self, mark: _UtteranceEnd) -> bool:
        """session.done for the utterance just spoken (unless a flush); True: the last one."""
        await self._finished_sentence()
        if mark.last:
            self.over = True  # session.done is the last event: later messages are not read
        if mark.done:
            self.pending_utterances -= 1
            await self._send_json(self._session_done())
            self.utterance_index += 1
            self.utterance = []
        return mark.last

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
            if isinstance(error, EngineDeadError):
                raise  # the session's ending says so
            await self._error_from(error)
        except (asyncio.CancelledError, _Ended):
            record.failure = "abort"  # the client left (or the session ended) mid-sentence
            raise
        finally:
            await speech.aclose()  # aborts the engine request if the sentence is unfinished
            if record.out is not None:  # an unfinished sentence's encoder pipeline
                record.out.release()
            if record.meter is not None:
                record.meter.close()
            state.gate.release()
            record.account(state)

    async def _send_event(self, event, record: _SegmentRecord, ready_s: float) -> None:
        options, plan = self.config.options, self.config.plan
        if isinstance(event, SegmentStarted):
            await self._finished_sentence()  # the previous sentence's words (generation runs)
            record.sentence_index = len(self.utterance)
            record.request_id = event.request_id
            record.tap = speech_run.word_tap(plan, self.state)
            # each sentence its own file (and its own timeline for its words, and its listener's)
            record.meter = playback_meter(plan, self.state)
            if record.meter is not None:
                record.meter.report_to(event.request_id)
            record.out = speech_run.audio_out(
                plan, self.state, taps=() if record.tap is None else (record.tap.push,), meter=record.meter)
            start = {
                "type": "audio.start", "id": event.request_id,
                "utterance_index": self.utterance_index, "sentence_index": record.sentence_index,
                "sentence_text": event.segment.text, "char_start": event.segment.start,
                "char_end": event.segment.end, "format": plan.response_format,
                "sample_rate": plan.sample_rate_hz}
            if record.tap is not None:
                start["word_timestamps"] = True
            await self._send_json(start)
        elif isinstance(event, SegmentAudio):
            record.first_audio(self.state, ready_s)
            record.pending.append(await record.out.push(event.audio))
            record.num_samples += event.audio.size
            if options.stream_audio:
                await self._send_audio(record)
        else:
            record.pending.append(await record.out.close())
            await self._send_audio(record)
            record.done = event
            self.utterance.append(event)
            if record.tap is None:
                await self._finish_sentence(record, event, None)
            else:  # sent once aligned; the speaker goes on to the next sentence meanwhile
                record.tap.end_sentence(event.segment.text)
                self.finishing = asyncio.create_task(self._aligned_finish(record, event))

    async def _aligned_finish(self, record: _SegmentRecord, done: SegmentDone) -> None:
        tap = record.tap
        try:
            tap.finish()
            sentences = [sentence async for sentence in tap.results()]
        finally:
            tap.close()
        await self._finish_sentence(record, done, words_json(sentences[0].words))

    async def _finished_sentence(self) -> None:
        """Wait until the last sentence's words and audio.done are out (a send that failed
        ends the session here, as it would have in the speaker)."""
        finishing, self.finishing = self.finishing, None
        if finishing is not None:
            await finishing

    async def _finish_sentence(self, record: _SegmentRecord, event: SegmentDone,
                               timestamps: list[dict] | None) -> None:
        """The sentence's last frame (the transport's; timestamps with word_timestamps) and
        its audio.done."""
        await self.audio.end_sentence(self.utterance_index, record.sentence_index, timestamps)
        await self._send_json({
            "type": "audio.done", "id": record.request_id,
            "utterance_index": self.utterance_index,
            "sentence_index": record.sentence_index, "total_bytes": record.num_bytes,
            "error": event.finish_reason == "abort",
            **event.timing(self.state.engine.sample_rate_hz)})

    async def _send_audio(self, record: _SegmentRecord) -> None:
        if not record.pending:
            return
        data, record.pending = b"".join(record.pending), []
        if not data:  # nothing yet (a codec's lookahead, an empty tail)
            return
        record.num_bytes += len(data)
        await self.audio.send_chunk(data, self.utterance_index, record.sentence_index,
                                    record.num_samples / self.state.engine.sample_rate_hz)

    def _session_done(self) -> dict:
        """The utterance just finished: its sentences, frames and audio."""
        rate = self.state.engine.sample_rate_hz
        samples = sum(done.end_sample - done.start_sample for done in self.utterance)
        return {"type": "session.done", "utterance_index": self.utterance_index,
                "total_sentences": len(self.utterance),
                "segments": [done.timing(rate) for done in self.utterance],
                "total_frames": sum(done.num_frames for done in self.utterance),
                "audio_seconds": round(samples / rate, 6)}

    # ------------------------------------------------------------------ sending
    async def send_error(self, message: str, code: str, param: str | None = None,
                         type: str = "invalid_request_error") -> None:
        await self._send_json(error_event(message, code, param, type))

    async def _error_from(self, error: Exception) -> None:
        api = to_api_error(error)
        await self.send_error(api.message, code=api.code or api.type, param=api.param, type=api.type)

    async def _send_json(self, payload: dict) -> None:
        await self._send(self.ws.send_text(json.dumps(payload, separators=(",", ":"))))

    async def _send_bytes(self, data: bytes) -> None:
        await self._send(self.ws.send_bytes(data))

    async def _send(self, sending) -> None:
        """One message, within --send-timeout-s as every HTTP response write: a client that
        stops reading ends the session, which aborts its sentence and frees its slot."""
        try:
            await asyncio.wait_for(sending, self.state.settings.send_timeout_s)
        except TimeoutError as error:
            raise _Ended(timed_out=True) from error
        except (WebSocketDisconnect, RuntimeError, OSError) as error:
            raise _Ended(timed_out=False) from error


class _SegmentRecord:
    """One sentence's bookkeeping: audio waiting to be sent, metrics recorded once."""

    def __init__(self):
        self.pending: list[bytes] = []
        self.out: AudioOut | None = None  # the sentence's pipeline, set by its SegmentStarted
        self.meter: PlaybackMeter | None = None  # its listener's clock (a streamed sentence)
        self.tap: WordTimestampTap | None = None  # its words' tap, with word_timestamps
        self.sentence_index = 0  # within its utterance
        self.request_id = ""  # its engine request's id (sglang-omni's `id`)
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
