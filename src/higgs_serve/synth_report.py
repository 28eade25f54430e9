"""What `higgs-serve synth` tells the user: progress while a batch runs (requests done, audio
seconds, real-time factor), one line per request with its own timing and the files written, and
a summary. Also writes a request's WAV + NPZ.

Chunks arrive on the engine's and codec's threads (`on_chunk`); everything here is fed from
there under one lock.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import BinaryIO

import numpy as np

from higgs_serve.errors import HiggsServeError
from higgs_serve.progress import ProgressReporter


def write_result(out_dir: Path, res, sample_rate: int) -> list[Path]:
    """OUT/<id>.wav (16-bit PCM) and OUT/<id>.npz (rows, frames, audio); returns both paths."""
    import soundfile as sf

    wav, npz = out_dir / f"{res.request_id}.wav", out_dir / f"{res.request_id}.npz"
    sf.write(wav, res.audio, sample_rate, subtype="PCM_16")
    with open(npz, "wb") as f:  # exactly this path (np.savez on a name could append .npz)
        np.savez(f, rows=res.rows.astype(np.int64), frames=res.frames.astype(np.int64),
                 audio=res.audio.astype(np.float32))
    return [wav, npz]


class SynthMonitor:
    """Per-request first-audio and finish times, streamed chunk files, and the progress line."""

    def __init__(self, out_dir: Path, request_ids: list[str], sample_rate: int, stream: bool,
                 progress: ProgressReporter):
        self._lock = threading.Lock()
        self._progress = progress
        self._sample_rate = sample_rate
        self._ids = list(request_ids)
        self._started = time.perf_counter()
        self.first_audio_s: dict[str, float] = {}
        self.done_s: dict[str, float] = {}
        self._samples: dict[str, int] = dict.fromkeys(request_ids, 0)
        self._files: dict[str, BinaryIO] = (
            {rid: open(out_dir / f"{rid}.stream.f32", "wb") for rid in request_ids} if stream else {})
        self._report()

    def on_chunk(self, request_id: str, chunk) -> None:
        with self._lock:
            now = time.perf_counter() - self._started
            if len(chunk.audio):
                self.first_audio_s.setdefault(request_id, now)
                self._samples[request_id] += len(chunk.audio)
            if request_id in self._files:
                self._files[request_id].write(chunk.audio.astype(np.float32).tobytes())
                self._files[request_id].flush()
            if chunk.is_final:
                self.done_s[request_id] = now
            self._report()

    def _report(self) -> None:
        audio_s = sum(self._samples.values()) / self._sample_rate
        wall = time.perf_counter() - self._started
        rtf = f", RTF {wall / audio_s:.2f}" if audio_s else ""
        self._progress(len(self.done_s), len(self._ids), "synthesizing", f"{audio_s:.1f} s audio{rtf}")

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._progress.close()

    def line(self, res, paths: list[Path], note: str = "") -> str:
        """`0000: 30 frames, 1.20 s audio, finish=length, first audio 0.05 s, done 0.31 s (RTF 0.26)
        -> OUT/0000.wav, OUT/0000.npz` (times from the batch's start; `note` goes before the files)."""
        seconds = len(res.audio) / self._sample_rate
        done = self.done_s.get(res.request_id, 0.0)
        first = self.first_audio_s.get(res.request_id)
        timing = f"first audio {first:.2f} s, " if first is not None else ""
        rtf = f" (RTF {done / seconds:.2f})" if seconds else ""
        written = ", ".join(str(p) for p in paths)
        return (f"{res.request_id}: {len(res.frames)} frames, {seconds:.2f} s audio, finish={res.finish_reason}, "
                f"{timing}done {done:.2f} s{rtf}{note} -> {written}")

    def summary(self) -> str:
        audio_s = sum(self._samples.values()) / self._sample_rate
        wall = max(self.done_s.values(), default=0.0)
        rtf = f" (RTF {wall / audio_s:.2f})" if audio_s else ""
        return f"{len(self.done_s)} request(s): {audio_s:.2f} s of audio in {wall:.2f} s{rtf}"


def stream_check(codec, out_dir: Path, res) -> str:
    """Streamed chunks must concatenate to the final audio; report the seam error against a
    one-shot decode of all frames (docs/model.md#streaming-windows)."""
    streamed = np.fromfile(out_dir / f"{res.request_id}.stream.f32", dtype=np.float32)
    if not np.array_equal(streamed, res.audio):
        raise HiggsServeError(f"{res.request_id}: streamed chunks do not concatenate to the final audio")
    if len(res.frames) == 0:
        return ", stream ok"
    oneshot = codec.decode_batch(res.frames[None])[0]
    err = float(np.max(np.abs(oneshot - res.audio))) if len(oneshot) == len(res.audio) else float("inf")
    peak = float(np.max(np.abs(oneshot))) or 1.0
    return f", stream ok ({len(res.chunks)} chunks, max seam error vs one-shot {err:.2e} = {err / peak:.2e} of peak)"
