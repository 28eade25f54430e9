"""Reference clip -> codec codes for voice cloning, with a bounded cache (docs/model.md,
sections Prompt layout and Reference encoder).

The service the server and the CLI call: decode file bytes (soundfile: wav, flac, ogg, mp3),
check the duration limits, resample to 24 kHz, run the codec encoder on the engine's device in
float32, and cache the codes by the CONTENT of the 24 kHz samples (an LRU bounded in entries and
in bytes), so a client that resends the same clip pays the encoder once.

Thread-safe: the server calls it from worker threads. Encodes run one at a time (one encoder, no
GPU memory spikes from parallel 30 s clips); on CUDA they run on their own stream so they overlap
the engine's steps instead of queueing behind them on the default stream.

`content_key` of a `ReferenceAudio` is the sha256 of the codes: the prefix cache keys the
placeholder blocks by it, so two voices never share KV and one voice always does.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from higgs_serve.audio.decode import read_clip
from higgs_serve.codec.codec_config import REQUIRED_SAMPLE_RATE
from higgs_serve.codec.encoder import CodecEncoder, prepare_reference_audio
from higgs_serve.engine.builder import LoadedModel, load_reference_encoder
from higgs_serve.engine.speech import ReferenceAudio
from higgs_serve.errors import InvalidRequestError
from higgs_serve.voices.registry import (
    MAX_REFERENCE_SECONDS,
    MIN_REFERENCE_SECONDS,
    decode_reference,
)

PARAM = "ref_audio"


@dataclass(frozen=True)
class ReferenceLimits:
    """Accepted reference durations and the code cache bounds."""

    min_seconds: float = MIN_REFERENCE_SECONDS
    max_seconds: float = MAX_REFERENCE_SECONDS
    cache_entries: int = 256
    cache_bytes: int = 64 << 20  # codes are 25 * 8 * 8 = 1600 bytes per second: ~1 h of references

    def __post_init__(self) -> None:
        if not 0 < self.min_seconds <= self.max_seconds:
            raise ValueError(f"reference limits need 0 < min_seconds <= max_seconds, got "
                             f"{self.min_seconds} and {self.max_seconds}")
        if self.cache_entries < 0 or self.cache_bytes < 0:
            raise ValueError(f"cache bounds must be >= 0, got cache_entries={self.cache_entries} "
                             f"cache_bytes={self.cache_bytes}")


class CodesCache:
    """LRU of codes by content key, bounded in entries and in bytes (values are read-only)."""

    def __init__(self, max_entries: int, max_bytes: int):
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, np.ndarray] = OrderedDict()
        self.num_bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: str) -> np.ndarray | None:
        codes = self._items.get(key)
        if codes is not None:
            self._items.move_to_end(key)
        return codes

    def put(self, key: str, codes: np.ndarray) -> None:
        if key in self._items or codes.nbytes > self.max_bytes or self.max_entries == 0:
            return  # already there, or would evict everything and still not fit
        self._items[key] = codes
        self.num_bytes += codes.nbytes
        while len(self._items) > self.max_entries or self.num_bytes > self.max_bytes:
            _, old = self._items.popitem(last=False)
            self.num_bytes -= old.nbytes


class ReferenceEncoder:
    """Reference audio -> codes [T, 8] int64. Build with `from_loaded` (or `for_engine`: lazy)."""

    def __init__(self, build: Callable[[], CodecEncoder], sample_rate_hz: int = REQUIRED_SAMPLE_RATE,
                 limits: ReferenceLimits | None = None):
        self._build = build  # called once, on first use, under the encode lock
        self._encoder: CodecEncoder | None = None
        self._stream: torch.cuda.Stream | None = None
        self.sample_rate_hz = sample_rate_hz
        self.limits = limits or ReferenceLimits()
        self._cache = CodesCache(self.limits.cache_entries, self.limits.cache_bytes)
        self._cache_lock = threading.Lock()
        self._encode_lock = threading.Lock()
        self.encode_calls = 0  # encoder runs (cache misses)
        self.cache_hits = 0
        self.encode_seconds = 0.0  # wall time spent in the encoder (cost per second of reference)
        self.encoded_audio_seconds = 0.0

    @classmethod
    def from_loaded(cls, loaded: LoadedModel, device: torch.device | str | None = None,
                    limits: ReferenceLimits | None = None) -> ReferenceEncoder:
        """The encoder of a loaded model, built now, on `device` (default: the engine's)."""
        encoder = load_reference_encoder(loaded, torch.device(device) if device is not None else None)
        service = cls(lambda: encoder, loaded.spec.codec.sample_rate, limits)
        service.warm()
        return service

    @classmethod
    def for_engine(cls, engine, limits: ReferenceLimits | None = None) -> ReferenceEncoder:
        """For an `AsyncEngine` not started yet: the encoder is built from `engine.loaded` on the
        first encode (or on `warm()`, which the server may call once the engine is ready)."""
        def build() -> CodecEncoder:
            if engine.loaded is None:
                raise RuntimeError("the reference encoder was used before the engine loaded its model")
            return load_reference_encoder(engine.loaded)

        return cls(build, engine.sample_rate_hz, limits)

    # ------------------------------------------------------------------ inputs
    @staticmethod
    def decode_audio_bytes(data: bytes, param: str = PARAM) -> tuple[np.ndarray, int]:
        """File bytes (wav, flac, ogg, mp3) -> ([n] float32 mono, sample rate).

        Raises InvalidRequestError naming `param` when the bytes are not readable audio.
        """
        return decode_reference(data, param)

    def check_duration(self, num_samples: int, sample_rate: int, param: str = PARAM) -> None:
        seconds = num_samples / sample_rate
        lo, hi = self.limits.min_seconds, self.limits.max_seconds
        if seconds < lo:
            raise InvalidRequestError(
                f"{param} is {seconds:.2f} s long; reference audio must be at least {lo:g} s", param=param)
        if seconds > hi:
            raise InvalidRequestError(
                f"{param} is {seconds:.2f} s long; reference audio may be at most {hi:g} s", param=param)

    # ------------------------------------------------------------------ encoding
    def encode_bytes(self, data: bytes, param: str = PARAM) -> np.ndarray:
        """File bytes -> codes [T, 8] int64 (decode, check, encode or cache hit)."""
        samples, rate = read_clip(data, param, self.limits.max_seconds)  # bounded decode
        return self.encode(samples, rate, param)

    def encode(self, samples: np.ndarray, sample_rate: int, param: str = PARAM) -> np.ndarray:
        """Decoded audio ([n] or [n, channels], any rate) -> codes [T, 8] int64 (the caller's copy).

        Raises InvalidRequestError (naming `param`) for a clip outside the duration limits.
        """
        audio = np.asarray(samples)
        self.check_duration(audio.shape[0] if audio.ndim else 0, sample_rate, param)
        try:
            audio_24k = prepare_reference_audio(audio, sample_rate, self.sample_rate_hz)  # [n] float32
        except InvalidRequestError as error:
            raise InvalidRequestError(f"{param}: {error}", param=param) from error
        return self._encode_24k(audio_24k)

    def __call__(self, audio_24k: np.ndarray) -> np.ndarray:
        """The server's hook (`server.state.ReferenceEncoder`): [n] float32 at 24 kHz -> [T, 8]."""
        return self.encode(audio_24k, self.sample_rate_hz)

    def _encode_24k(self, audio_24k: np.ndarray) -> np.ndarray:
        key = hashlib.sha256(np.ascontiguousarray(audio_24k, dtype=np.float32).tobytes()).hexdigest()
        with self._cache_lock:
            codes = self._cache.get(key)
            if codes is not None:
                self.cache_hits += 1
                return codes.copy()
        with self._encode_lock:
            with self._cache_lock:  # a concurrent caller may have encoded the same clip meanwhile
                codes = self._cache.get(key)
                if codes is not None:
                    self.cache_hits += 1
                    return codes.copy()
            codes = self._run_encoder(audio_24k)
            with self._cache_lock:
                self._cache.put(key, codes)
                self.encode_calls += 1
        return codes.copy()  # callers own their copy; the cached one stays read-only

    def _run_encoder(self, audio_24k: np.ndarray) -> np.ndarray:
        encoder = self._ensure_encoder()
        device = _device_of(encoder)
        t0 = time.perf_counter()
        with torch.inference_mode(), _on_stream(self._stream):
            x = torch.from_numpy(np.array(audio_24k, dtype=np.float32)).to(device)  # own copy: input may be read-only
            codes = encoder.encode(x).to("cpu")  # [T, 8] int64; the copy waits for the stream
        self.encode_seconds += time.perf_counter() - t0
        self.encoded_audio_seconds += len(audio_24k) / self.sample_rate_hz
        out = np.ascontiguousarray(codes.numpy(), dtype=np.int64)
        out.setflags(write=False)  # the cached copy: nobody may mutate it
        return out

    def _ensure_encoder(self) -> CodecEncoder:
        if self._encoder is None:
            encoder = self._build()
            device = _device_of(encoder)
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # weights copied on the default stream are ready
                self._stream = torch.cuda.Stream(device)
            self._encoder = encoder
        return self._encoder

    def warm(self) -> None:
        """Build the encoder now (otherwise the first encode does)."""
        with self._encode_lock:
            self._ensure_encoder()

    @property
    def cache_size(self) -> int:
        with self._cache_lock:
            return len(self._cache)

    @property
    def cache_bytes(self) -> int:
        with self._cache_lock:
            return self._cache.num_bytes

    # ------------------------------------------------------------------ requests
    @staticmethod
    def reference_audio(codes: np.ndarray, ref_text: str | None = None) -> ReferenceAudio:
        """Codes [T, 8] -> the engine's `ReferenceAudio`, keyed by a hash of the codes."""
        return reference_audio(codes, ref_text)


def reference_audio(codes: np.ndarray, ref_text: str | None = None) -> ReferenceAudio:
    """Codes [T, 8] int64 -> `ReferenceAudio` with content_key = sha256 of the codes' bytes."""
    codes = np.ascontiguousarray(codes, dtype=np.int64)
    if codes.ndim != 2 or codes.shape[1] != 8 or codes.shape[0] == 0:
        raise InvalidRequestError(f"reference codes must have shape [T>0, 8], got {list(codes.shape)}",
                                  param=PARAM)
    text = ref_text if ref_text is not None and ref_text.strip() else None
    return ReferenceAudio(codes=codes, ref_text=text,
                          content_key=hashlib.sha256(codes.tobytes()).hexdigest())


def _on_stream(stream: torch.cuda.Stream | None):
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def _device_of(encoder: CodecEncoder) -> torch.device:
    return next(encoder.parameters()).device
