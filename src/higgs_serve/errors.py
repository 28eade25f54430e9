"""Every exception type higgs-serve raises on purpose, in one place.

The server maps these to HTTP statuses once (server/errors.py); the CLI prints their message.
"""


class HiggsServeError(Exception):
    """Base class: a problem with a clear message meant for the user."""


class ConfigError(HiggsServeError, ValueError):
    """A config.json, deploy YAML or CLI value is invalid (the message names the key and file)."""


class CheckpointError(HiggsServeError):
    """A checkpoint cannot be found or does not match the expected tensor layout."""


class TokenizerError(HiggsServeError):
    """tokenizer.json is missing or lacks a required special token."""


class InvalidRequestError(HiggsServeError, ValueError):
    """A request field is invalid; `param` names the field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class UnreadableAudioError(InvalidRequestError):
    """The bytes are no audio file this server reads (not a damaged one): a caller that also
    takes headerless samples says which field would have read them."""


class ConflictError(InvalidRequestError):
    """The request collides with another one (a voice registered twice at once, or deleted while
    this request was using it): 409, the client may retry."""


class InputTooLongError(InvalidRequestError):
    """The prompt (input, plus the reference when cloning) leaves no room to generate: 413."""


class EngineOverloadedError(HiggsServeError):
    """The waiting queue is full; the client should retry later: in `retry_after_s` seconds when
    the refusal knows when (None: the server's usual Retry-After)."""

    def __init__(self, message: str = "", retry_after_s: int | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class OverCapacityError(EngineOverloadedError):
    """A stream whose first audio would come later than its time-to-first-audio budget: the
    server is speaking as many streams as it can in real time (engine/deadlines/). The server
    answers 503 with `Retry-After: retry_after_s` at once, rather than a stream that stutters."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message, retry_after_s)


class EngineDeadError(HiggsServeError):
    """The engine loop has stopped; no request can be served."""


class AlignmentError(HiggsServeError):
    """Word timestamps could not be computed for some audio (alignment/): the audio is still
    delivered; its timestamps are reported as missing."""

    code = "alignment_failed"  # the words error's code (docs/api.md#word-timestamps)


class AlignerOverloadedError(AlignmentError):
    """The aligner processes are too far behind to take a sentence's audio (their queue is
    bounded): its words are skipped, its audio is unaffected."""

    code = "aligner_overloaded"


class AlignerFailedError(AlignmentError):
    """The aligner process of a sentence died or stopped answering, twice (the first time the
    sentence is retried on another process)."""

    code = "aligner_failed"


class WatermarkUnavailableError(HiggsServeError):
    """The watermark is on but its model cannot be loaded (package missing, file absent or
    damaged): start-up refuses to go on with unmarked audio."""


class EncoderFailedError(HiggsServeError):
    """A response's encoder process stopped (or its codec failed) mid-response, or the encoder
    processes could not be started: that response ends with an error (a 503 with Retry-After if
    nothing was sent), the others go on; at start-up the server refuses to start."""


class EncoderLostError(EncoderFailedError):
    """The encoder process of a response died or stopped answering (not its codec refusing the
    audio): a response none of whose bytes has left is retried on another process."""
