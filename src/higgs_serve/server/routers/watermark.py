"""POST /v1/audio/watermark/detect: does this audio carry the higgs-serve watermark?

Multipart form: `file` (any format the server reads: wav, flac, ogg/opus, mp3, aac, m4a/mp4,
webm; or headerless samples with `format` pcm, ulaw or alaw and optionally `sample_rate`).
Answer: `{"detected": bool, "verdict": "marked" | "not_marked" | "inconclusive", "reason": why an
inconclusive verdict is one | null, "score": float}`
(docs/api.md#watermark-and-provenance). The same API key as every /v1 route; the body is bounded
by the body-limit middleware and by DETECT_MAX_BYTES here. The upload is read from the form
parser's spool (disk past 1 MB) block by block, resampled to the detector's rate and scored as
it is decoded (audio/watermark_detect.py), on the detection threads; at most a few detections
run and a few wait, past that a 429 (server/limits/detect_slots.py). Never on the engine's device.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, Request, UploadFile

from higgs_serve.audio.decode import MAX_RATE_HZ, MIN_RATE_HZ
from higgs_serve.audio.watermark_detect import DETECT_MAX_BYTES, DETECT_MAX_SECONDS
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
    sample_rate: Annotated[int | None, Form(description=f"The rate of headerless samples, {MIN_RATE_HZ}-"
                                                        f"{MAX_RATE_HZ} Hz (default: 24000 for pcm, 8000 "
                                                        "for ulaw and alaw).")] = None,
) -> WatermarkDetection:
    unknown = sorted(set((await request.form()).keys()) - set(FIELDS))
    if unknown:
        raise ApiError(400, f"unknown field(s): {', '.join(unknown)}", param=",".join(unknown))
    if sample_rate is not None and not MIN_RATE_HZ <= sample_rate <= MAX_RATE_HZ:
        raise ApiError(400, f"sample_rate {sample_rate}: give a rate from {MIN_RATE_HZ} to {MAX_RATE_HZ} Hz "
                            "(or leave it out for the format's usual rate)", param="sample_rate")
    if _size(file) > DETECT_MAX_BYTES:
        raise ApiError(413, f"file exceeds the limit of {DETECT_MAX_BYTES} bytes", param="file",
                       code="file_too_large")
    state = server_state(request)
    found = await state.detect_slots.run(state.detector.detect_file, file.file, "file", format, sample_rate)
    return WatermarkDetection(detected=found.detected, verdict=found.verdict, reason=found.reason,
                              score=round(found.score, 6))


def _size(file: UploadFile) -> int:
    """The upload's size in bytes (the form parser counted it; else its spool's end)."""
    if file.size is not None:
        return file.size
    size = file.file.seek(0, 2)
    file.file.seek(0)
    return size
