"""Server-sent events for `stream_format: "sse"` (OpenAI's speech event names).

Each event is `event: <type>` plus one `data:` line holding JSON that repeats the type, so both
OpenAI-style parsers (which read `data` only) and EventSource clients (which read `event`) work:

    speech.audio.delta  {"type", "audio": base64 bytes of the response_format stream}
    speech.audio.done   {"type", "usage": {input_tokens, output_tokens, total_tokens}, "finish_reason"}
    speech.audio.error  {"type", "error": {"message", "type", "param", "code"}, "partial_audio"}
"""

from __future__ import annotations

import base64
import json

MEDIA_TYPE = "text/event-stream"


def encode_event(event_type: str, payload: dict) -> bytes:
    body = json.dumps({"type": event_type, **payload}, separators=(",", ":"))
    return f"event: {event_type}\ndata: {body}\n\n".encode()


def audio_delta(audio_bytes: bytes) -> bytes:
    return encode_event("speech.audio.delta",
                        {"audio": base64.b64encode(audio_bytes).decode("ascii")})


def audio_done(input_tokens: int, output_tokens: int, finish_reason: str | None) -> bytes:
    usage = {"input_tokens": input_tokens, "output_tokens": output_tokens,
             "total_tokens": input_tokens + output_tokens}
    return encode_event("speech.audio.done", {"usage": usage, "finish_reason": finish_reason})


def audio_error(error: dict, partial_audio: bool) -> bytes:
    """error: the OpenAI error object; partial_audio tells the client to discard what it has."""
    return encode_event("speech.audio.error", {"error": error, "partial_audio": partial_audio})
