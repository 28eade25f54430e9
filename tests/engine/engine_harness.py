"""Helpers for the engine acceptance tests (issue 3): a CPU engine stepped by hand.

Most tests drive `EngineCore.step()` themselves instead of starting the engine thread, so
arrival times ("submit request 9 after step 12") are exact and every run is deterministic. The
codec thread runs as in production; `ManualEngine.wait` waits for its final chunks.
"""

from __future__ import annotations

import numpy as np

from higgs_serve.config.deploy import DeployConfig
from higgs_serve.config.loader import load_deploy_config
from higgs_serve.engine.async_engine import CollectingSink
from higgs_serve.engine.builder import LoadedModel, RuntimeOptions, build_engine_core
from higgs_serve.engine.core import EngineCore, EngineHooks
from higgs_serve.engine.speech import SpeechRequest
from higgs_serve.sampling_params import SamplingParams

CPU = RuntimeOptions(device="cpu")
SAMPLES_PER_FRAME = 960

# Short texts of different lengths (prompts of ~5 to ~45 tokens with the tiny tokenizer).
TEXTS = (
    "Hi",
    "Hello there.",
    "The cat sat on the mat.",
    "My neighbour reads a book about the sea.",
    "The old teacher quickly reads the letter and then writes a long reply to everyone.",
    "A small dog walks past the robot.",
    "Our team builds a boat.",
    "The captain remembers the song that the young girl sings about the river at night.",
)


def engine_deploy(
    *,
    max_num_seqs: int = 16,
    num_gpu_blocks: int = 1024,
    max_num_batched_tokens: int = 4096,
    enable_prefix_caching: bool = True,
    window: dict | None = None,
    kv_cache_dtype: str = "auto",
    codec_dtype: str = "float32",
    watermark: bool = False,
    deadlines: bool = True,
) -> DeployConfig:
    """The shipped default profile on CPU, shrunk for tests; `window` overrides the streaming
    window keys (docs/model.md#streaming-windows). The watermark is off unless asked for: these
    tests compare the codec's audio with one-shot decodes (tests/engine/test_watermark_stage.py
    tests the mark)."""
    stage0 = {
        "devices": "cpu",
        "max_num_seqs": max_num_seqs,
        "num_gpu_blocks": num_gpu_blocks,
        "max_num_batched_tokens": max_num_batched_tokens,
        "enable_prefix_caching": enable_prefix_caching,
        "kv_cache_dtype": kv_cache_dtype,
        # the shipped capture sizes go to 64; sizes above max_num_seqs are a config error
        "compilation_config": {"cudagraph_capture_sizes": [s for s in (1, 2, 4, 8, 16) if s <= max_num_seqs]},
        "deadlines": {"enabled": deadlines},
    }
    overrides: dict = {"0": stage0, "1": {"devices": "cpu", "dtype": codec_dtype}, "watermark": watermark}
    if window:
        overrides["connectors"] = {"talker_to_codec": {"extra": window}}
    return load_deploy_config(None, "higgs_multimodal_qwen3", cli_overrides=overrides)


def sampling(temperature: float = 0.0, seed: int = 0, frames: int = 30, min_frames: int = 0,
             top_k: int = 30, top_p: float = 0.8) -> SamplingParams:
    return SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                          max_new_tokens=frames, min_new_tokens=min_frames)


def speech(request_id: str, text: str, params: SamplingParams, stream: bool = False) -> SpeechRequest:
    return SpeechRequest(request_id, text, params, stream=stream)


class Collected(CollectingSink):
    """One request's output as its sink saw it (chunks from the codec thread): the engine's own
    collecting sink (chunks, rows [N, 8] and frames [T, 8] int64, finish_reason, prompt_tokens,
    error, done) plus the audio joined."""

    def __init__(self, request_id: str):
        super().__init__(None, request_id)  # no per-chunk callback

    @property
    def audio(self) -> np.ndarray:
        """[n] float32: the chunks concatenated."""
        if not self.chunks:
            return np.zeros(0, np.float32)
        return np.concatenate([c.audio for c in self.chunks])


def assert_same_output(got: Collected, ref: Collected, what: str) -> None:
    """The same rows exactly, and the same audio to float rounding (the codec may batch a
    request's window with other requests' windows)."""
    np.testing.assert_array_equal(got.rows, ref.rows, err_msg=f"{what}: rows")
    peak = float(np.max(np.abs(ref.audio)))
    np.testing.assert_allclose(got.audio, ref.audio, rtol=0, atol=1e-5 * peak, err_msg=f"{what}: audio")


class ManualEngine:
    """An `EngineCore` with its stages' threads running (codec, watermark) and its step loop
    driven by the test."""

    def __init__(self, loaded: LoadedModel, deploy: DeployConfig, hooks: EngineHooks | None = None):
        self.core: EngineCore = build_engine_core(loaded, deploy, CPU, hooks)
        self.core.start_stages()

    @property
    def kv(self):
        return self.core.scheduler.kv

    def submit(self, request: SpeechRequest) -> Collected:
        sink = Collected(request.request_id)
        self.core.submit(request, sink)
        return sink

    def steps(self, n: int) -> None:
        for _ in range(n):
            if not self.core.step():
                return

    def run(self, max_steps: int = 5000) -> None:
        """Step until the scheduler has nothing left to run."""
        for _ in range(max_steps):
            if not self.core.step():
                return
        raise AssertionError(f"the engine still had work after {max_steps} steps")

    @staticmethod
    def wait(sinks: list[Collected], timeout: float = 60.0) -> None:
        for sink in sinks:
            assert sink.done.wait(timeout), f"request {sink.request_id}: no final chunk within {timeout} s"
            if sink.error is not None:
                raise sink.error

    def generate(self, requests: list[SpeechRequest]) -> list[Collected]:
        """Submit all at once, run to completion, return the collected outputs in order."""
        sinks = [self.submit(r) for r in requests]
        self.run()
        self.wait(sinks)
        return sinks

    def close(self) -> None:
        self.core.stop_stages()
