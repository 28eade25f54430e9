"""What the end-to-end tests of tests/cluster share: request sizes, a reference clip, waiting."""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import httpx
import numpy as np
import soundfile as sf

T = TypeVar("T")
FRAMES = 8
FIXED = {"max_new_tokens": FRAMES, "min_new_tokens": FRAMES}
PCM_BYTES = FRAMES * 960 * 2  # one FIXED request as s16le at 24 kHz
# the replicas' --segment-max-chars in tests/cluster/conftest.py: below the default (300), so a
# long-form request proves the flag reached them; above LONG_TEXT's length (one segment)
SEGMENT_MAX_CHARS = 200
# long enough that its text-derived frame cap allows 400-frame requests
LONG_TEXT = ("A long sentence for a long request, spoken slowly and clearly, with many words in it, "
             "so that the frame cap that follows from its text stays above four hundred frames.")


def tone_clip(*tones: tuple[float, float], seconds: float = 1.2) -> bytes:
    """A 24 kHz 16-bit wav of summed sines, (frequency Hz, amplitude) each: a reference clip."""
    t = np.arange(int(seconds * 24000)) / 24000
    audio = sum(amplitude * np.sin(2 * np.pi * freq * t) for freq, amplitude in tones)
    buffer = io.BytesIO()
    sf.write(buffer, np.asarray(audio, dtype=np.float32), 24000, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def wait_for(predicate: Callable[[], T], timeout_s: float, what: str, log: Path | None = None) -> T:
    """The predicate's first truthy value (a refused connection counts as not yet), or fail
    naming `what`, with the tail of `log`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    tail = log.read_text()[-4000:] if log is not None else ""
    raise AssertionError(f"{what} not reached in {timeout_s} s:\n{tail}")


def assert_marked_and_detected(http: httpx.Client) -> None:
    """Speech through `http` carries the mark (on by default) and its detect route finds it;
    junk there is a 400 naming `file`."""
    frames = {"max_new_tokens": 50, "min_new_tokens": 50}  # 2 s: the tiny model's audio scores ~1.0 marked
    answer = http.post("/v1/audio/speech", json={"input": "Hello there, how are you today?", "seed": 3,
                                                 "response_format": "wav", "stream": False, **frames})
    assert answer.status_code == 200, answer.text
    found = http.post("/v1/audio/watermark/detect", files={"file": ("speech.wav", answer.content)})
    assert found.status_code == 200, found.text
    # the tiny model's audio is not speech: the mark's score is high, the verdict inconclusive
    assert found.json()["score"] >= 0.9 and found.json()["verdict"] in ("marked", "inconclusive")
    refused = http.post("/v1/audio/watermark/detect", files={"file": ("junk.wav", b"not audio" * 10)})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "file"


def replica_processes(under: Path) -> dict[str, tuple[int, str]]:
    """The live replicas of the front end whose work directory is below `under` (its TMPDIR):
    replica id -> (pid, private socket path), read from the processes' command lines (the
    front end's public /health does not give them)."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"higgs_serve.cli_replica" not in args or b"--uds" not in args:
            continue
        socket_path = args[args.index(b"--uds") + 1].decode()
        if Path(socket_path).is_relative_to(under):
            found[Path(socket_path).stem.removeprefix("replica-")] = (int(proc.name), socket_path)
    return found
