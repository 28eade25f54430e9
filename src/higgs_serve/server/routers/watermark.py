"""POST /v1/audio/watermark/detect: does this audio carry the higgs-serve watermark?

Multipart form: `file` (any format the server reads: wav, flac, ogg/opus, mp3, aac, m4a/mp4,
webm; or headerless samples with `format` pcm, ulaw or alaw and optionally `sample_rate`).
Answer: `{"detected": bool, "score": float}`. The same API key as every /v1 route; the body is
bounded by the body-limit middleware and by DETECT_MAX_BYTES here; decoding is bounded
(audio/decode.py) and runs on the audio worker pool, detection on the CPU
(audio/watermark_detect.py), never on the engine's device.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, Request, UploadFile

from higgs_serve.audio.watermark_detect import DETECT_MAX_BYTES, DETECT_MAX_SECONDS, decode_for_detection
from higgs_serve.server.errors import ApiError
from higgs_serve.server.schemas import ERROR_RESPONSES, WatermarkDetection
from higgs_serve.server.state import server_state

router = APIRouter(prefix="/v1/audio/watermark", tags=["watermark"])
DETECT_PATH = "/v1/audio/watermark/detect"
FIELDS = ("file", "format", "sample_rate")


@router.post("/detect", response_model=WatermarkDetection, responses=ERROR_RESPONSES)
async def detect_watermark(
    request: Request,
    file: Annotated[UploadFile, File(description=f"The audio to check: a file in any supported format "
                                                 f"(<= {DETECT_MAX_BYTES // 2**20} MiB, <= "
                                                 f"{DETECT_MAX_SECONDS:g} s), or headerless samples "
                                                 "with `format`.")],
    format: Annotated[str | None, Form(description="For headerless samples only: pcm (16-bit little-endian), "
                                                   "ulaw or alaw.")] = None,
    sample_rate: Annotated[int | None, Form(description="The rate of headerless samples (default: 24000 for "
                                                        "pcm, 8000 for ulaw and alaw).")] = None,
) -> WatermarkDetection:
    unknown = sorted(set((await request.form()).keys()) - set(FIELDS))
    if unknown:
        raise ApiError(400, f"unknown field(s): {', '.join(unknown)}", param=",".join(unknown))
    data = await file.read(DETECT_MAX_BYTES + 1)
    if len(data) > DETECT_MAX_BYTES:
        raise ApiError(413, f"file exceeds the limit of {DETECT_MAX_BYTES} bytes", param="file",
                       code="file_too_large")
    state = server_state(request)
    audio, rate_hz = await state.audio_workers.run(decode_for_detection, data, "file", format, sample_rate)
    detection = await state.audio_workers.run(state.detector.detect, audio, rate_hz)
    return WatermarkDetection(detected=detection.detected, score=round(detection.score, 6))
