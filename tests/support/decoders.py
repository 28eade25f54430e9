"""Real decoders as a listener's player would run them: FFmpeg's own libraries through PyAV (the
demuxer probed from the bytes, the decoder, swresample; what `ffmpeg -v error -i - -f s16le -ac 1
-ar RATE -` runs, without needing the `ffmpeg` program) and soundfile (libsndfile). Each returns
int16 samples [n] and says what it decoded. And FFmpeg's own encoders, for files a peer made."""

from __future__ import annotations

import io

import av
import av.logging
import numpy as np
import soundfile as sf

# headerless formats: the FFmpeg demuxer they must be opened with (nothing in the bytes says it)
_RAW = {"pcm": "s16le", "ulaw": "mulaw", "alaw": "alaw"}
# a codec frame in samples at `rate` (mp3: 576 below 32 kHz, 1152 from 32 kHz)
CODEC_FRAME = {"opus": lambda rate: rate // 50, "aac": lambda rate: 1024,
               "mp3": lambda rate: 1152 if rate >= 32000 else 576}
# what a streamed lossy file decodes to beyond its input (samples at its rate): mp3 streams
# cannot carry LAME's delay (576 encoder + 529 decoder samples), ADTS cannot carry AAC's 1024
# priming samples; both are padded to whole frames. Ogg/Opus carries pre-skip and end: exact.
STREAM_DELAY = {"mp3": 1105, "aac": 1024, "opus": 0}
# a file (stream: false): mp3's LAME/Info frame carries the delay; ADTS still cannot
FILE_DELAY = {"aac": 1024}


def av_decode(data: bytes, response_format: str, rate_hz: int, sample_format: str = "s16") -> np.ndarray:
    """The bytes through FFmpeg's libraries -> mono at rate_hz, int16 (`sample_format` "flt":
    float32, as `-f f32le` gives). As strict as the command
    line with `-v error` and an empty stderr: any error FFmpeg raises or logs while probing,
    demuxing, decoding or converting fails the decode (AssertionError saying what it logged)."""
    demuxer = _RAW.get(response_format)
    options = {"sample_rate": str(rate_hz), "ch_layout": "mono"} if demuxer else {}
    previous = av.logging.get_level()
    av.logging.set_level(av.logging.ERROR)  # routes FFmpeg's log lines through PyAV, capturable
    try:
        with av.logging.Capture() as logs:
            samples = _decode_all(data, demuxer, options, rate_hz, sample_format)
    except (av.FFmpegError, ValueError, IndexError) as error:
        raise AssertionError(f"FFmpeg could not decode the {response_format}: {error}") from error
    finally:
        av.logging.set_level(previous)
    errors = [f"{name}: {message.strip()}" for level, name, message in logs
              if level <= av.logging.ERROR]
    if errors:
        raise AssertionError(f"FFmpeg logged errors decoding the {response_format}: "
                             f"{'; '.join(errors)[:300]}")
    return samples


def _decode_all(data: bytes, demuxer: str | None, options: dict[str, str], rate_hz: int,
                sample_format: str) -> np.ndarray:
    convert = av.AudioResampler(format=sample_format, layout="mono", rate=rate_hz)
    pieces = [np.zeros(0, {"s16": "<i2", "flt": "<f4"}[sample_format])]
    with av.open(io.BytesIO(data), mode="r", format=demuxer, options=options) as container:
        if not container.streams.audio:
            raise AssertionError("no audio stream in the file")
        for frame in container.decode(container.streams.audio[0]):
            pieces += [out.to_ndarray().reshape(-1) for out in convert.resample(frame)]
    pieces += [out.to_ndarray().reshape(-1) for out in convert.resample(None)]  # the resampler's tail
    return np.concatenate(pieces)


def soundfile_decode(data: bytes) -> tuple[np.ndarray, int]:
    samples, rate_hz = sf.read(io.BytesIO(data), dtype="int16")
    return samples, rate_hz


def av_encode(audio: np.ndarray, rate_hz: int, codec: str, muxer: str, out_rate_hz: int | None = None,
              bit_rate: int | None = None) -> bytes:
    """[n] float32 mono at rate_hz -> a file made by FFmpeg's own encoder `codec` in the `muxer`
    format (what `ffmpeg -f f32le -ar RATE -i - -c:a CODEC [-ar OUT] [-b:a RATE] -f MUXER -` makes)."""
    out_rate_hz = out_rate_hz or rate_hz
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=muxer) as container:
        stream = container.add_stream(codec, rate=out_rate_hz, layout="mono")
        if bit_rate is not None:
            stream.bit_rate = bit_rate
        frame = av.AudioFrame.from_ndarray(audio.astype(np.float32)[None, :], format="flt",
                                           layout="mono")
        frame.sample_rate, frame.pts = rate_hz, 0
        convert = av.AudioResampler(format=stream.codec_context.format, layout="mono",
                                    rate=out_rate_hz)
        for converted in [*convert.resample(frame), *convert.resample(None)]:
            container.mux(stream.encode(converted))
        container.mux(stream.encode(None))  # the encoder's tail
    return buffer.getvalue()
