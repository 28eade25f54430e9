"""What `higgs-serve synth` tells the user: progress while a batch runs (requests done, audio
seconds, real-time factor), one line per request with its own timing and the files written, and
a summary. Also writes a request's WAV + NPZ, and with --word-timestamps its words.json.

Chunks arrive on the engine's and codec's threads (`on_chunk`); everything here is fed from
there under one lock.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
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


class WordsWriter:
    """OUT/<id>.words.json: `[{word, start_ms, end_ms}]`, one entry per whitespace word of the
    text (inline tags removed), on the file's timeline. Each piece (the whole text, or each
    long-form segment) is aligned on its own audio; a piece the aligner cannot align (audio far
    too short for its words) keeps its words with `start_ms`/`end_ms` null, and the run says so.
    Runs in this process after the audio is made (docs/api.md#word-timestamps)."""

    def __init__(self, out_dir: Path, sample_rate_hz: int):
        self._out_dir = out_dir
        self._rate = sample_rate_hz
        self._aligner = None
        self.failed_pieces = 0

    def write(self, request_id: str, audio: np.ndarray, pieces: list[tuple[str, int, int]]) -> Path:
        """pieces: (text, start_sample, end_sample) of `audio`, in order."""
        import json

        from higgs_serve.alignment import aligner_for, build_aligner, user_words
        from higgs_serve.errors import AlignmentError

        if self._aligner is None:
            self._aligner = build_aligner(aligner_for("auto"))
        entries = []
        for text, start, end in pieces:
            words = user_words(text)
            try:
                timings = self._aligner.align(audio[start:end], self._rate, words)
            except AlignmentError:
                self.failed_pieces += 1
                entries += [{"word": word, "start_ms": None, "end_ms": None} for word in words]
                continue
            entries += [t.shifted(start / self._rate).to_json() for t in timings]
        path = self._out_dir / f"{request_id}.words.json"
        path.write_text(json.dumps(entries, ensure_ascii=False, indent=1))
        return path


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

    def summary(self, long_form: LongFormTotals | None = None) -> str:
        """Every request of the run: this batch's and the long texts spoken before it."""
        long_form = long_form or LongFormTotals()
        audio_s = sum(self._samples.values()) / self._sample_rate + long_form.audio_s
        wall = max(self.done_s.values(), default=0.0) + long_form.wall_s
        rtf = f" (RTF {wall / audio_s:.2f})" if audio_s else ""
        count = len(self.done_s) + long_form.requests
        return f"{count} request(s): {audio_s:.2f} s of audio in {wall:.2f} s{rtf}"


@dataclass
class LongFormTotals:
    """The long texts of a synth run (spoken one recording each, before the batch)."""

    requests: int = 0
    audio_s: float = 0.0
    wall_s: float = 0.0


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


def synth_long_form(engine, requests, segment_max_chars: int, max_audio_s: float, out_dir: Path,
                    words: WordsWriter | None = None,
                    progress: ProgressReporter | None = None) -> LongFormTotals:
    """Texts past `segment_max_chars`: split and spoken as one recording each
    (engine/long_form.py); writes OUT/<id>.wav and OUT/<id>.segments.json (segment timestamps),
    and with `words` OUT/<id>.words.json (each segment aligned, on the recording's timeline).
    Progress is reported per segment; returns the totals the run's summary adds."""
    import functools
    import json

    import soundfile as sf

    from higgs_serve.engine.async_engine import stream_from_core
    from higgs_serve.engine.long_form import synthesize_long_form
    from higgs_serve.text import group_segments

    sample_rate = engine.loaded.spec.codec.sample_rate
    generate = functools.partial(stream_from_core, engine.core)
    totals = LongFormTotals()
    for request in requests:
        t0 = time.perf_counter()
        segments = group_segments(request.text, segment_max_chars)
        label = f"{request.request_id} (long-form)"

        def on_segment(done, total=len(segments), label=label, t0=t0) -> None:
            if progress is not None:
                audio_s = done.end_sample / sample_rate
                progress(done.index + 1, total, label,
                         f"{audio_s:.1f} s audio, RTF {(time.perf_counter() - t0) / audio_s:.2f}"
                         if audio_s else "")

        result = synthesize_long_form(generate, request, segments, int(max_audio_s * sample_rate),
                                      on_segment=on_segment)
        if progress is not None:
            progress.close()  # a recording cut by the audio cap ends before its last segment
        wav, timings_path = out_dir / f"{request.request_id}.wav", out_dir / f"{request.request_id}.segments.json"
        sf.write(wav, result.audio, sample_rate, subtype="PCM_16")
        timings = [done.timing(sample_rate) for done in result.segments]
        timings_path.write_text(json.dumps(timings, indent=1))
        written = [wav, timings_path]
        if words is not None:
            written.append(words.write(request.request_id, result.audio, [
                (done.segment.text, done.start_sample, done.end_sample) for done in result.segments]))
        print(f"{request.request_id}: long-form, {len(timings)} segments, {result.num_frames} frames, "
              f"{len(result.audio) / sample_rate:.2f} s audio, finish={result.finish_reason}, "
              f"{time.perf_counter() - t0:.2f} s -> {', '.join(str(p) for p in written)}", flush=True)
        totals.requests += 1
        totals.audio_s += len(result.audio) / sample_rate
        totals.wall_s += time.perf_counter() - t0
    return totals
