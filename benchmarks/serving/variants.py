"""Request variants swept on one server (bench_serving.py `--variants`): a server start costs a
minute or more on a GPU with graph capture, and what a request asks for (its format, SSE or raw
bytes, word timestamps) changes nothing in how the server was started, so one run measures several
variants, each as levels of its own.

A variant is `FORMAT[+sse|+audio][+words][@C,C,...]`: the response format; `sse` streams SSE events
(`audio`, raw bytes of the format, is the default, or `--stream-format`'s); `words` asks for word
timestamps (SSE only: a raw stream asking for them waits for the whole audio); `@C,...` its own
concurrency levels (default `--concurrency`). Examples: `pcm@1,16,64,128,256 mp3@256 opus@256`,
`pcm+sse@64 pcm+sse+words@64`.
"""

from __future__ import annotations

from dataclasses import dataclass

RESPONSE_FORMATS = ("pcm", "wav", "flac", "mp3", "opus", "aac", "ulaw", "alaw")
STREAM_FORMATS = ("audio", "sse")


@dataclass(frozen=True)
class Variant:
    response_format: str
    stream_format: str  # audio | sse
    word_timestamps: str  # on | off
    levels: tuple[int, ...]

    @property
    def name(self) -> str:
        """The variant as written, less its levels and the defaults (`pcm`, `pcm+sse+words`)."""
        return "+".join([self.response_format] + (["sse"] if self.stream_format == "sse" else [])
                        + (["words"] if self.word_timestamps == "on" else []))


def parse_variant(spec: str, levels: list[int], stream_format: str = "audio",
                  word_timestamps: str = "off") -> Variant:
    """One `--variants` entry; `levels`, `stream_format` and `word_timestamps` are the run's
    defaults. Raises ValueError with the reason."""
    body, at, tail = spec.partition("@")
    if at:
        try:
            levels = [int(c) for c in tail.split(",")]
        except ValueError:
            raise ValueError(f"variant {spec!r}: levels after @ are concurrencies, e.g. pcm@1,64") from None
        if not levels or min(levels) < 1:
            raise ValueError(f"variant {spec!r}: concurrencies must be >= 1")
    formats = []
    for part in body.split("+"):
        if part in RESPONSE_FORMATS:
            formats.append(part)
        elif part in STREAM_FORMATS:
            stream_format = part
        elif part == "words":
            word_timestamps = "on"
        else:
            raise ValueError(f"variant {spec!r}: {part!r} is not a response format "
                             f"({', '.join(RESPONSE_FORMATS)}), sse, audio or words")
    if len(formats) != 1:
        raise ValueError(f"variant {spec!r}: name exactly one response format")
    if word_timestamps == "on" and stream_format != "sse":
        raise ValueError(f"variant {spec!r}: word timestamps need sse (a raw stream asking for them "
                         "waits for the whole audio, so its TTFA would be the whole request)")
    return Variant(formats[0], stream_format, word_timestamps, tuple(levels))


def level_plan(variants: list[Variant]) -> list[tuple[int, Variant]]:
    """Every (concurrency, variant) level, lowest concurrency first; at one concurrency the
    variants in the order given (a variant's repeated level runs again)."""
    entries = [(c, i, j, v) for i, v in enumerate(variants) for j, c in enumerate(v.levels)]
    return [(c, v) for c, _, _, v in sorted(entries, key=lambda e: e[:3])]
