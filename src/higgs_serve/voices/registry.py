"""Registered voices (reference clips for cloning), persisted on disk, with cached codec codes.

Layout, one folder per voice so a voice is added or removed with a single rename:

    <directory>/<name>/voice.json   {"name", "ref_text", "created_at", "duration_s", "sample_rate_hz"}
    <directory>/<name>/audio.wav    the reference, mono PCM_16 at the model rate (24 kHz)
    <directory>/<name>/codes.npy    [T, 8] int64 codec codes, written once the voice is first encoded

Uploads are decoded and resampled once, at registration, so a bad file fails the upload and not
a later speech request. Codes are read from disk at most once per voice and then served from
memory, so a speech request with a registered voice touches no file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from higgs_serve.audio.decode import load_clip, read_clip
from higgs_serve.errors import InvalidRequestError

MAX_UPLOAD_BYTES = 10 * 1024 * 1024
MAX_REFERENCE_SECONDS = 30.0
MIN_REFERENCE_SECONDS = 0.5  # also the voice-cloning limits' defaults (reference_encoder.py)
# Names are folder names: no separators, no dot files, bounded length.
_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
RESERVED_NAMES = frozenset({"default"})


@dataclass(frozen=True)
class Voice:
    name: str
    ref_text: str | None
    created_at: int          # unix seconds
    duration_s: float
    sample_rate_hz: int


def check_voice_name(name: str) -> None:
    """Raise InvalidRequestError (param name) unless `name` is a legal, unreserved voice name."""
    if not _NAME_PATTERN.match(name):
        raise InvalidRequestError(
            "voice name must be 1-64 characters of letters, digits, '_', '-', '.', "
            f"starting with a letter or digit; got {name!r}", param="name")
    if name in RESERVED_NAMES:
        raise InvalidRequestError(f"voice name {name!r} is reserved", param="name")


def decode_reference(audio_bytes: bytes, param: str) -> tuple[np.ndarray, int]:
    """Reference file bytes (wav, flac, ogg, mp3, aac, m4a, webm) -> ([n] float32 mono, rate Hz).

    The one decode of a reference clip (uploads, `ref_audio`, the CLI's files), bounded by
    audio/decode.py (header checks before decoding, at most MAX_REFERENCE_SECONDS decoded).
    Errors are InvalidRequestError naming `param`.
    """
    return read_clip(audio_bytes, param, MAX_REFERENCE_SECONDS)


def normalise_reference(audio_bytes: bytes, sample_rate_hz: int, param: str) -> np.ndarray:
    """Reference file bytes -> [n] float32 mono at `sample_rate_hz`, with the duration checked.

    Errors are InvalidRequestError naming `param` (the upload field or `ref_audio`).
    """
    return load_clip(audio_bytes, param, sample_rate_hz, MIN_REFERENCE_SECONDS,
                     MAX_REFERENCE_SECONDS)


class VoiceRegistry:
    """Thread-safe store of voices under `directory` (created if missing)."""

    def __init__(self, directory: str | os.PathLike, sample_rate_hz: int = 24000):
        self.directory = Path(directory)
        self.sample_rate_hz = sample_rate_hz
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._voices: dict[str, Voice] = self._scan()
        self._codes: dict[str, np.ndarray] = {}  # name -> [T, 8] int64, loaded once

    def _scan(self) -> dict[str, Voice]:
        voices = {}
        for leftover in self.directory.glob(".staging-*"):  # an upload interrupted by a crash
            shutil.rmtree(leftover)
        for meta_path in sorted(self.directory.glob("*/voice.json")):
            voice = Voice(**json.loads(meta_path.read_text()))
            voices[voice.name] = voice
        return voices

    def list(self) -> list[Voice]:
        with self._lock:
            return sorted(self._voices.values(), key=lambda voice: voice.name)

    def get(self, name: str) -> Voice | None:
        with self._lock:
            return self._voices.get(name)

    def add(self, name: str, audio_bytes: bytes, ref_text: str | None = None) -> Voice:
        """Decode, resample to the model rate and persist a reference clip under `name`."""
        check_voice_name(name)
        if len(audio_bytes) > MAX_UPLOAD_BYTES:
            raise InvalidRequestError(
                f"audio file is {len(audio_bytes)} bytes; the limit is {MAX_UPLOAD_BYTES}",
                param="audio_sample")
        audio = normalise_reference(audio_bytes, self.sample_rate_hz, param="audio_sample")
        voice = Voice(name=name, ref_text=ref_text or None, created_at=int(time.time()),
                      duration_s=round(audio.shape[0] / self.sample_rate_hz, 3),
                      sample_rate_hz=self.sample_rate_hz)
        with self._lock:
            if name in self._voices:
                raise InvalidRequestError(f"voice {name!r} already exists", param="name")
            staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=self.directory))
            sf.write(staging / "audio.wav", audio, self.sample_rate_hz, subtype="PCM_16")
            (staging / "voice.json").write_text(json.dumps(asdict(voice)))
            os.rename(staging, self.directory / name)
            self._voices[name] = voice
        return voice

    def delete(self, name: str) -> bool:
        """Remove a voice; False if it did not exist."""
        with self._lock:
            if self._voices.pop(name, None) is None:
                return False
            self._codes.pop(name, None)
            shutil.rmtree(self.directory / name)
            return True

    def load_audio(self, name: str) -> np.ndarray:
        """The stored reference: [n] float32 mono at `sample_rate_hz`."""
        audio, _ = sf.read(self._folder(name) / "audio.wav", dtype="float32")
        return audio

    def cached_codes(self, name: str) -> np.ndarray | None:
        """[T, 8] int64 codes saved by store_codes (shared: do not modify), or None if never
        encoded."""
        with self._lock:
            codes = self._codes.get(name)
        if codes is not None:
            return codes
        path = self._folder(name) / "codes.npy"
        if not path.exists():
            return None
        return self._remember(name, np.load(path))

    def store_codes(self, name: str, codes: np.ndarray) -> None:
        """Cache the encoded reference (codes: [T, 8] int64) beside the audio and in memory."""
        folder = self._folder(name)
        staging = folder / ".codes.npy.tmp"
        codes = np.array(codes, dtype=np.int64)  # our own copy: the caller may reuse its array
        with open(staging, "wb") as handle:
            np.save(handle, codes)
        os.replace(staging, folder / "codes.npy")
        self._remember(name, codes)

    def _remember(self, name: str, codes: np.ndarray) -> np.ndarray:
        # Shared by every request using this voice; nothing downstream writes to it (left
        # writable because torch.as_tensor warns on read-only numpy arrays).
        with self._lock:
            if name in self._voices:  # not deleted meanwhile
                self._codes[name] = codes
        return codes

    def _folder(self, name: str) -> Path:
        if self.get(name) is None:
            raise KeyError(f"unknown voice {name!r}")
        return self.directory / name
