"""POST /v1/audio/speech/batch (vllm-omni's shape): 1-32 items, each a non-streamed speech request.

The envelope's speech fields are defaults; an item's own fields (non-null) override them. The
envelope is validated as a whole (a malformed batch is a 400), then what the batch holds in all
(server/limits/batch_limits.py: its input before any work, its audio while it is spoken; 413). Each
item is then validated, admitted, planned and generated on its own, concurrently, through the
same engine and admission gate as single requests, at most `max_num_seqs` of one batch at a
time, into the file `/speech` makes for the same body with `stream: false` (an item longer than
one segment long-form: one recording, one slot; the file spooled to disk past 1 MiB). Whatever
goes wrong with one item (bad field, bad reference, queue full, engine error) becomes that
item's error result; the batch itself answers 200 with `results` in item order and
`total`/`succeeded`/`failed`, its JSON sent as it is read from the files
(server/last_mile/batch_answer.py). A client that disconnects abandons the batch: every item in flight
is aborted and every file discarded.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ValidationError

from higgs_serve.audio import formats
from higgs_serve.errors import InvalidRequestError
from higgs_serve.server.run import long_form
from higgs_serve.server.run import speech_run
from higgs_serve.server.last_mile.audio_file import AudioFile
from higgs_serve.server.last_mile.batch_answer import BatchAnswer, BatchItem
from higgs_serve.server.limits.batch_limits import AudioBudget, BatchTooLarge, check_batch_input
from higgs_serve.server.errors import ApiError, describe_validation_errors, to_api_error
from higgs_serve.server.run.generation import Generation
from higgs_serve.server.routers.speech import check_engine
from higgs_serve.server.schemas import (
    ERROR_RESPONSES,
    BatchItemResult,
    SpeechBatchRequest,
    SpeechBatchResponse,
    SpeechRequestBody,
    Usage,
)
from higgs_serve.server.plan.speech_plan import SpeechPlan
from higgs_serve.server.state import ServerState, server_state
from higgs_serve.text import Segment

router = APIRouter(tags=["audio"])
_STREAM_FIELDS = ("stream", "stream_format")


@router.post("/v1/audio/speech/batch", response_model=SpeechBatchResponse,
             responses=ERROR_RESPONSES)
async def create_speech_batch(body: SpeechBatchRequest, request: Request) -> Response:
    arrived_s = time.perf_counter()
    state = server_state(request)
    check_engine(state)
    check_batch_input(body.items, state.settings)
    _refuse_word_timestamps(body)
    batch = _Batch(state, body, arrived_s)
    try:
        items = await speech_run.unless_disconnected(batch.run(), request)
    except BaseException:
        batch.discard()
        raise
    if items is speech_run.CLIENT_GONE:
        batch.discard()
        return Response(status_code=499)
    answer = BatchAnswer(f"speech-batch-{uuid.uuid4().hex}", items)
    # on a signing server, the claim header when an item's file carries no manifest
    return answer.response(None if answer.all_signed else speech_run.claim_headers(state))


def _refuse_word_timestamps(body: SpeechBatchRequest) -> None:
    """A batch answers JSON with base64 files and has no place for timestamps: asked for, in
    the defaults or an item, it is a 400 rather than a field accepted and ignored."""
    asked = body.word_timestamps or any(item.get("word_timestamps") is True for item in body.items)
    if asked:
        raise InvalidRequestError(
            "word_timestamps are not offered on /v1/audio/speech/batch: send each text to "
            "/v1/audio/speech (X-Word-Timestamps header, or speech.words events with "
            "stream_format 'sse')", param="word_timestamps")


class _Batch:
    """One batch's items in flight, the audio they made in all, and the files they hold."""

    def __init__(self, state: ServerState, body: SpeechBatchRequest, arrived_s: float):
        self.state = state
        self.items = body.items
        self.defaults = body.model_dump(exclude_unset=True, exclude={"items"})
        self.arrived_s = arrived_s
        self.slots = asyncio.Semaphore(state.engine.deploy.stage0.max_num_seqs)
        self.budget = AudioBudget(state.settings, state.engine.sample_rate_hz)
        self.files: list[AudioFile] = []  # every finished item's, until the answer takes them

    async def run(self) -> list[BatchItem]:
        """Every item's result in order; BatchTooLarge (every other item cancelled) if their
        audio passes the batch's limit."""
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(self._run_item(index, item))
                         for index, item in enumerate(self.items)]
        except* BatchTooLarge as too_large:
            raise too_large.exceptions[0] from None
        return [task.result() for task in tasks]

    def discard(self) -> None:
        for file in self.files:
            file.discard()

    async def _run_item(self, index: int, item: dict[str, Any]) -> BatchItem:
        """One item, start to finish; every failure but the batch's own becomes its error."""
        try:
            body = _item_body(item, self.defaults)
            async with self.slots:
                return await self._generate(index, body)
        except (asyncio.CancelledError, BatchTooLarge):
            raise
        except Exception as error:  # noqa: BLE001: each item answers for itself
            api_error = to_api_error(error)
            return BatchItem(BatchItemResult(
                index=index, status="error", error=api_error.message, param=api_error.param,
                code=api_error.code, status_code=api_error.status), None)

    async def _generate(self, index: int, body: SpeechRequestBody) -> BatchItem:
        """One item exactly as POST /v1/audio/speech answers the same body with stream false:
        the same plan, and an input longer than one segment spoken as one long-form recording."""
        state = self.state
        plan = await speech_run.admit_plan(body, state)  # the input limit is checked here
        try:
            segments = await long_form.plan_segments(body.input, state.settings)
        except BaseException:
            state.gate.release()
            raise
        if len(segments) > 1:
            return await self._generate_long_form(index, plan, segments)
        generation = Generation(state, plan, self.arrived_s)
        await speech_run.start(generation, state)
        try:
            file = await self._file(_audio(generation), plan)
            if generation.finish_reason == "abort":  # cut by the shutdown's grace period
                file.discard()
                generation.close()
                raise speech_run.shutting_down()
        except asyncio.CancelledError:
            generation.close()  # unfinished: aborted in the engine, counted "abort"
            raise
        except BaseException as error:  # an ApiError (the batch's limit): counted "abort"
            generation.close(outcome=None if isinstance(error, ApiError) else "error")
            raise
        generation.close()
        return _success(index, plan, file, generation.finish_reason, generation.num_frames)

    async def _generate_long_form(self, index: int, plan: SpeechPlan,
                                  segments: list[Segment]) -> BatchItem:
        """A long item: its admitted plan's segment chain (server/run/long_form.py), one slot for
        all of it, encoded into its file as /speech's long-form file response is."""
        run = long_form.LongFormRun(self.state, plan, segments, self.arrived_s)
        with speech_run.counted_failures(self.state):  # labelled as a single request's start
            await run.start()
        try:
            if run.aborted_before_audio:  # queued past the shutdown's grace period
                raise speech_run.shutting_down()
            file = await self._file(run.audio(), plan)
            if run.finish_reason == "abort":  # cut by the shutdown's grace period
                file.discard()
                raise speech_run.shutting_down()
        except asyncio.CancelledError:
            await asyncio.shield(run.close())  # the batch was abandoned: counted "abort"
            raise
        except BaseException as error:
            await run.close(outcome=None if isinstance(error, ApiError) else "error")
            raise
        await run.close()
        return _success(index, plan, file, run.finish_reason, run.session.num_frames)

    async def _file(self, audio: AsyncIterator[np.ndarray], plan: SpeechPlan) -> AudioFile:
        """The item's whole-file path, its audio counted against the batch's; the file is the
        batch's to discard from here on."""
        file = await speech_run.file_of(self.budget.counted(audio, plan.speed), plan, self.state)
        self.files.append(file)
        return file


async def _audio(generation: Generation) -> AsyncIterator[np.ndarray]:
    async for chunk in generation.chunks():
        yield chunk.audio


def _item_body(item: dict[str, Any], defaults: dict[str, Any]) -> SpeechRequestBody:
    """Defaults overridden by the item's non-null fields -> a validated, non-streamed request."""
    streamed = [name for name in _STREAM_FIELDS if item.get(name) is not None]
    if streamed:
        raise InvalidRequestError(
            f"batch items are answered as files, not streamed: drop {', '.join(streamed)}",
            param=streamed[0])
    merged = {**defaults, **{key: value for key, value in item.items() if value is not None},
              "stream": False}  # a file, as /speech answers the same body with stream: false
    try:
        return SpeechRequestBody.model_validate(merged)
    except ValidationError as error:
        message, param = describe_validation_errors(list(error.errors()))
        raise InvalidRequestError(message, param=param) from error


def _success(index: int, plan: SpeechPlan, file: AudioFile, finish_reason: str | None,
             num_frames: int) -> BatchItem:
    """The item's result, its audio_data left empty for its file (server/last_mile/batch_answer.py)."""
    usage = Usage(input_tokens=plan.input_tokens, output_tokens=num_frames,
                  total_tokens=plan.input_tokens + num_frames)
    return BatchItem(BatchItemResult(index=index, status="success", audio_data="",
                                     media_type=formats.MEDIA_TYPES[plan.response_format],
                                     sample_rate=plan.sample_rate_hz,
                                     finish_reason=finish_reason, usage=usage), file)
