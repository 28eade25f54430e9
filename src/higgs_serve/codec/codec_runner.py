"""Stage 1: decodes codec windows of many requests in batched calls, on its own thread and stream.

Each window is a stateless decode (SPEC §1.9), so windows of different requests with the same
length stack into one batch. Windows of one request are delivered in the order they were
submitted. The thread never waits on Stage 0: the talker keeps stepping while windows decode.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from higgs_serve.codec.decoder import CodecDecoder

logger = logging.getLogger(__name__)


@dataclass
class CodecJob:
    request_id: str
    frames: np.ndarray  # [T, 8] int64 codes in [0, 1023]; T may be 0 for an empty final window
    trim_front_frames: int
    trim_back_frames: int
    is_final: bool
    # called on the codec thread with (job, audio [n] float32) or (job, None, error)
    deliver: Callable[..., None]


class CodecRunner:
    def __init__(self, decoder: CodecDecoder, device: torch.device, max_batch_windows: int, samples_per_frame: int):
        self.decoder = decoder
        self.device = device
        self.max_batch_windows = max_batch_windows
        self.samples_per_frame = samples_per_frame
        self._jobs: queue.SimpleQueue[CodecJob | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.windows_decoded = 0
        self.batches_decoded = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="higgs-codec", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout=30)
            self._thread = None

    def submit(self, job: CodecJob) -> None:
        self._jobs.put(job)

    # ------------------------------------------------------------------ thread
    def _run(self) -> None:
        while True:
            first = self._jobs.get()
            if first is None:
                return
            jobs = [first]
            stop = False
            while True:
                try:
                    nxt = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                jobs.append(nxt)
            self._process(jobs)
            if stop:
                return

    def _process(self, jobs: list[CodecJob]) -> None:
        audio: dict[int, np.ndarray] = {}
        errors: dict[int, BaseException] = {}
        by_len: dict[int, list[int]] = defaultdict(list)
        for i, job in enumerate(jobs):
            if len(job.frames) == 0:
                audio[i] = np.zeros(0, dtype=np.float32)
            else:
                by_len[len(job.frames)].append(i)
        for length, idxs in by_len.items():
            for lo in range(0, len(idxs), self.max_batch_windows):
                group = idxs[lo : lo + self.max_batch_windows]
                try:
                    wave = self.decode_batch(np.stack([jobs[i].frames for i in group]))
                except (RuntimeError, ValueError) as exc:  # a failed decode fails its requests only
                    logger.exception("codec decode of %d windows failed", len(group))
                    for i in group:
                        errors[i] = exc
                    continue
                for row, i in enumerate(group):
                    audio[i] = self._trim(wave[row], jobs[i])
        for i, job in enumerate(jobs):
            if i in errors:
                job.deliver(job, None, errors[i])
            else:
                job.deliver(job, audio[i], None)

    def _trim(self, wave: np.ndarray, job: CodecJob) -> np.ndarray:
        spf = self.samples_per_frame
        end = len(wave) - job.trim_back_frames * spf
        return wave[job.trim_front_frames * spf : end]

    @torch.inference_mode()
    def decode_batch(self, frames: np.ndarray) -> np.ndarray:
        """frames [B, T, 8] int64 → audio [B, T*960] float32 (host)."""
        codes = torch.from_numpy(frames)
        if self._stream is not None:
            with torch.cuda.stream(self._stream):
                wave = self.decoder(codes.to(self.device, non_blocking=True))
                out = wave.float().cpu()
        else:
            out = self.decoder(codes.to(self.device)).float()
        self.windows_decoded += len(frames)
        self.batches_decoded += 1
        return out.numpy()
