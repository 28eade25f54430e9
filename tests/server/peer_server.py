"""The real server the peer-compatibility tests replay requests against, and their helpers.

One server (session-scoped fixture `peer_server` in conftest.py) for test_peer_compat*.py: the
tiny checkpoint served under two names (ours and the hub id peers send), a voices directory, and
a media directory it may read reference files from (--allowed-local-media-path), next to a file
outside it, a symlink escaping it and a `..` path.
"""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import soundfile as sf
from live_server import Subprocess, serve_subprocess

NAME = "higgs-tiny-peer"
HUB_ID = "bosonai/higgs-audio-v3-tts-4b"
RATE = 24000
FRAMES = 12
FIXED = {"max_new_tokens": FRAMES, "min_new_tokens": FRAMES}
REF_TEXT = "The words of the reference clip."


def _clip() -> bytes:
    t = np.arange(int(1.2 * RATE)) / RATE
    audio = sum(np.sin(2 * np.pi * f * t) for f in (220.0, 330.0, 1250.0)) * (0.5 / 3)
    buffer = io.BytesIO()
    sf.write(buffer, audio.astype(np.float32), RATE, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


CLIP = _clip()


def clip_b64() -> str:
    return base64.b64encode(CLIP).decode()


@dataclass
class PeerServer:
    server: Subprocess
    media_dir: Path
    clip_codes: np.ndarray  # [T, 8], written by `higgs-serve encode-voice` for CLIP


def _media(work: Path) -> Path:
    media = work / "media"
    (media / "sub").mkdir(parents=True)
    (media / "clip.wav").write_bytes(CLIP)
    (work / "outside.wav").write_bytes(CLIP)
    (media / "escape_link.wav").symlink_to(work / "outside.wav")
    return media


def _encode_voice(model_dir: Path, clip: Path, out: Path) -> np.ndarray:
    subprocess.run([sys.executable, "-m", "higgs_serve.cli", "--log-level", "WARNING",
                    "encode-voice", str(clip), "-o", str(out), "--model", str(model_dir),
                    "--device", "cpu"], check=True, capture_output=True, timeout=240)
    return np.load(out)


@contextmanager
def start_peer_server(model_dir: Path, work: Path) -> Iterator[PeerServer]:
    media = _media(work)
    codes = _encode_voice(model_dir, media / "clip.wav", work / "codes.npy")
    # the default profile (the deadline policy off): the first chunk is the profile's, tests
    # compare a seed's audio
    overrides = json.dumps({"0": {"compilation_config": {"cudagraph_capture_sizes": [1, 2]}}})
    with serve_subprocess(model_dir, work, [
        "--served-model-name", NAME, HUB_ID, "--max-num-seqs", "2", "--max-queue", "8",
        "--voices-dir", str(work / "voices"), "--allowed-local-media-path", str(media),
        "--stage-overrides", overrides,
    ]) as server:
        yield PeerServer(server, media, codes)


def frames_of(headers) -> int:
    return int(headers["x-usage-output-tokens"])


def speak(http: httpx.Client, **fields) -> httpx.Response:
    """POST /v1/audio/speech (input defaults to a short text) answered as one file (stream:
    false unless `fields` say otherwise); asserts 200."""
    response = http.post("/v1/audio/speech", json={"input": "Hello world.", "stream": False,
                                                   **fields})
    assert response.status_code == 200, response.text
    return response
