"""Registered voices (reference clips for cloning), persisted on disk, with cached codec codes.

Layout, one folder per voice so a voice is added or removed with a single rename:

    <directory>/<name>/voice.json   {"name", "ref_text", "created_at", "duration_s", "sample_rate_hz",
                                     "consent", "speaker_description"}
    <directory>/<name>/audio.wav    the reference, mono PCM_16 at the model rate (24 kHz)
    <directory>/<name>/codes.npy    [T, 8] int64 codec codes, written once the voice is first encoded

Uploads are decoded and resampled once, at registration, so a bad file fails the upload and not
a later speech request. Codes are read from disk at most once per voice and then served from
memory, so a speech request with a registered voice touches no file.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from higgs_serve.audio.decode import load_clip, read_clip
from higgs_serve.codec.codec_config import REQUIRED_SAMPLE_RATE
from higgs_serve.errors import ConflictError, InvalidRequestError

logger = logging.getLogger(__name__)

MAX_UPLOAD_BYTES = 10 * 1024 * 1024
MAX_REFERENCE_SECONDS = 30.0
MIN_REFERENCE_SECONDS = 0.5  # also the voice-cloning limits' defaults (reference_encoder.py)
# Names are folder names: no separators, no dot files, bounded length.
_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # fullmatch: no trailing "\n"
_STAGING, _DELETED = ".staging-", ".deleted-"  # dot folders: never valid voice names
RESERVED_NAMES = frozenset({"default"})


@dataclass(frozen=True)
class Voice:
    name: str
    ref_text: str | None
    created_at: int          # unix seconds
    duration_s: float
    sample_rate_hz: int
    consent: str | None = None  # the uploader's consent reference, kept as given
    speaker_description: str | None = None


def check_voice_name(name: str) -> None:
    """Raise InvalidRequestError (param name) unless `name` is a legal, unreserved voice name."""
    if not isinstance(name, str) or _NAME_PATTERN.fullmatch(name) is None:
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
    """Thread-safe store of voices under `directory` (created if missing).

    Races: every method that touches a voice's files takes `_lock` and checks that the voice is
    still the one the caller looked up (`Voice` objects are compared by identity, so a voice
    deleted and registered again under the same name is a different voice). A request that
    encoded the old voice therefore never writes its codes into the new one, and reading a voice
    deleted meanwhile is a ConflictError (409), never a missing-file error.

    Crash safety: a voice appears by renaming a complete, fsynced staging folder into place and
    disappears by renaming it aside (`.deleted-*`) before removing it, so a crash leaves either
    the whole voice or none; leftovers are removed at the next start. A folder that is not a
    complete voice (empty or corrupt voice.json, no audio) is skipped with a warning.
    """

    def __init__(self, directory: str | os.PathLike, sample_rate_hz: int = REQUIRED_SAMPLE_RATE):
        self.directory = Path(directory)
        self.sample_rate_hz = sample_rate_hz
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._voices: dict[str, Voice] = self._scan()
        self._codes: dict[str, np.ndarray] = {}  # name -> [T, 8] int64, loaded once

    def _scan(self) -> dict[str, Voice]:
        for leftover in [*self.directory.glob(_STAGING + "*"), *self.directory.glob(_DELETED + "*")]:
            shutil.rmtree(leftover, ignore_errors=True)  # interrupted by a crash
        voices = {}
        for folder in sorted(path for path in self.directory.iterdir() if path.is_dir()):
            voice = _read_voice(folder)
            if voice is not None:
                voices[voice.name] = voice
        return voices

    def list(self) -> list[Voice]:
        with self._lock:
            return sorted(self._voices.values(), key=lambda voice: voice.name)

    def get(self, name: str) -> Voice | None:
        with self._lock:
            return self._voices.get(name)

    def add(self, name: str, audio_bytes: bytes, ref_text: str | None = None, *,
            consent: str | None = None, speaker_description: str | None = None,
            overwrite: bool = False) -> Voice:
        """`register`, for callers that do not ask whether a voice was replaced."""
        return self.register(name, audio_bytes, ref_text, consent=consent,
                             speaker_description=speaker_description, overwrite=overwrite)[0]

    def register(self, name: str, audio_bytes: bytes, ref_text: str | None = None, *,
                 consent: str | None = None, speaker_description: str | None = None,
                 overwrite: bool = False) -> tuple[Voice, bool]:
        """Decode, resample to the model rate and persist a reference clip under `name`;
        returns the voice and whether it replaced a registered one (decided under the lock, so
        a voice registered or deleted by another request meanwhile is counted as it was).

        Raises ConflictError if `name` exists (also when another registration won the race),
        unless `overwrite`: then the old voice is renamed aside and removed, and requests still
        using it see a ConflictError rather than the new voice's codes."""
        check_voice_name(name)
        if len(audio_bytes) > MAX_UPLOAD_BYTES:
            raise InvalidRequestError(
                f"audio file is {len(audio_bytes)} bytes; the limit is {MAX_UPLOAD_BYTES}",
                param="audio_sample")
        audio = normalise_reference(audio_bytes, self.sample_rate_hz, param="audio_sample")
        voice = Voice(name=name, ref_text=ref_text or None, created_at=int(time.time()),
                      duration_s=round(audio.shape[0] / self.sample_rate_hz, 3),
                      sample_rate_hz=self.sample_rate_hz, consent=consent or None,
                      speaker_description=speaker_description or None)
        staging = Path(tempfile.mkdtemp(prefix=_STAGING, dir=self.directory))
        doomed = None
        try:
            _write_synced(staging / "audio.wav", _wav_bytes(audio, self.sample_rate_hz))
            _write_synced(staging / "voice.json", json.dumps(asdict(voice)).encode())
            _fsync_dir(staging)
            with self._lock:
                replaced = name in self._voices
                on_disk = (self.directory / name).exists()  # not if removed behind our back
                if (replaced or on_disk) and not overwrite:
                    raise ConflictError(f"voice {name!r} already exists; delete it first or send "
                                        "overwrite=true", param="name")
                self._codes.pop(name, None)
                if on_disk:  # the old folder goes aside in one atomic step, as delete() does
                    doomed = self.directory / f"{_DELETED}{uuid.uuid4().hex}"
                    os.rename(self.directory / name, doomed)
                os.rename(staging, self.directory / name)
                _fsync_dir(self.directory)
                self._voices[name] = voice
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # gone already unless the add failed
            if doomed is not None:
                shutil.rmtree(doomed, ignore_errors=True)
        return voice, replaced

    def delete(self, name: str) -> bool:
        """Remove a voice; False if it did not exist. Renamed aside first (one atomic step),
        then removed."""
        with self._lock:
            if self._voices.pop(name, None) is None:
                return False
            self._codes.pop(name, None)
            doomed = self.directory / f"{_DELETED}{uuid.uuid4().hex}"
            try:
                os.rename(self.directory / name, doomed)
            except FileNotFoundError:  # removed behind our back: nothing left to remove
                return True
            _fsync_dir(self.directory)
        shutil.rmtree(doomed, ignore_errors=True)
        return True

    def load_audio(self, voice: Voice | str) -> np.ndarray:
        """The stored reference: [n] float32 mono at `sample_rate_hz`."""
        with self._lock:
            folder = self._folder(voice)
            try:
                audio, _ = sf.read(folder / "audio.wav", dtype="float32")
            except (sf.LibsndfileError, OSError) as error:  # damaged or removed behind our back
                logger.warning("voice %s: cannot read %s: %s", folder.name, folder, error)
                raise InvalidRequestError(
                    f"voice {folder.name!r} cannot be read from disk; delete it and register it "
                    "again", param="voice") from error
        return audio

    def cached_codes(self, voice: Voice | str) -> np.ndarray | None:
        """[T, 8] int64 codes saved by store_codes (shared: do not modify), or None if never
        encoded."""
        with self._lock:
            folder = self._folder(voice)
            name = folder.name
            codes = self._codes.get(name)
            if codes is None and (folder / "codes.npy").exists():
                try:
                    codes = self._codes[name] = _load_codes(folder / "codes.npy")
                except (OSError, ValueError) as error:  # damaged: encode the clip again
                    logger.warning("voice %s: ignoring unreadable codes.npy: %s", name, error)
        return codes

    def store_codes(self, voice: Voice | str, codes: np.ndarray) -> bool:
        """Cache the encoded reference (codes: [T, 8] int64) beside the audio and in memory.

        With a `Voice`, only while that very voice is registered: codes of a voice deleted (and
        perhaps registered again) while it was being encoded are dropped. Returns whether stored.
        """
        codes = np.array(codes, dtype=np.int64)  # our own copy: the caller may reuse its array
        buffer = io.BytesIO()
        np.save(buffer, codes)
        with self._lock:
            try:
                folder = self._folder(voice)
            except ConflictError:
                return False
            staging = folder / ".codes.npy.tmp"
            _write_synced(staging, buffer.getvalue())
            os.replace(staging, folder / "codes.npy")
            # Shared by every request using this voice; nothing downstream writes to it (left
            # writable because torch.as_tensor warns on read-only numpy arrays).
            self._codes[folder.name] = codes
        return True

    def _folder(self, voice: Voice | str) -> Path:
        """The voice's folder; the caller holds `_lock`. KeyError for an unknown name,
        ConflictError for a `Voice` no longer registered (deleted or replaced)."""
        name = voice if isinstance(voice, str) else voice.name
        current = self._voices.get(name)
        if current is None and isinstance(voice, str):
            raise KeyError(f"unknown voice {name!r}")
        if current is None or (not isinstance(voice, str) and current is not voice):
            raise ConflictError(f"voice {name!r} was deleted while this request was using it",
                                param="voice")
        return self.directory / name


def _read_voice(folder: Path) -> Voice | None:
    """The voice stored in `folder`, or None (logged) if it is not a complete voice."""
    try:
        voice = Voice(**json.loads((folder / "voice.json").read_text()))
        check_voice_name(voice.name)
        if voice.name != folder.name:
            raise ValueError(f"its voice.json names {voice.name!r}")
        if not (folder / "audio.wav").is_file():
            raise ValueError("its audio.wav is missing")
    except (OSError, ValueError, TypeError) as error:  # JSONDecodeError is a ValueError
        logger.warning("skipping voice folder %s: not a complete voice (%s)", folder, error)
        return None
    return voice


def _load_codes(path: Path) -> np.ndarray:
    codes = np.load(path, allow_pickle=False)
    if codes.ndim != 2 or codes.shape[1] != 8 or codes.shape[0] == 0:
        raise ValueError(f"codes have shape {list(codes.shape)}, expected [T>0, 8]")
    return codes.astype(np.int64, copy=False)


def _wav_bytes(audio: np.ndarray, sample_rate_hz: int) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, audio, sample_rate_hz, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
