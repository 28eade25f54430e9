"""On CUDA: codec decoder CUDA graphs replay exactly what the eager decoder computes, and the
runner replays its warmed-up shapes without capturing anything new (skipped without CUDA)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from support.codec_fixtures import random_codec_tensors
from support.split_conv_checks import check_conv_split

from higgs_serve.codec.chunker import (StreamChunker, WindowParams, WindowShape, first_chunk_shapes, ramp_first_chunks,
                                      warm_window_shapes)
from higgs_serve.codec.codec_config import CodecConfig
from higgs_serve.codec.codec_graphs import CodecGraphs
from higgs_serve.codec.codec_runner import CodecRunner
from higgs_serve.codec.decoder import CodecDecoder

HOP = 960


@pytest.fixture(autouse=True)
def _float32_convolutions():
    """Real float32 convolutions, as the engine's float32 codec runs them (engine/builder.py turns
    cuDNN's TF32 off at load). torch's default lets cuDNN use TF32, and its algorithms for a batch
    of 2 and a batch of 1 then differ by ~1e-3 of peak, so without this these tests passed only
    where an engine had been built earlier in the same process."""
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = old


def _decoder(dtype: torch.dtype = torch.float32) -> CodecDecoder:
    cfg = CodecConfig()
    dec = CodecDecoder(cfg).to(device="cuda", dtype=dtype).eval()
    dec.load_state(random_codec_tensors(cfg, seed=1))
    return dec


def _codes(batch: int, frames: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1024, (batch, frames, 8), dtype=np.int64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_graph_replay_equals_eager(dtype):
    dec = _decoder(dtype)
    runner = CodecRunner(dec, torch.device("cuda"), max_batch_windows=3, samples_per_frame=HOP)  # eager
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.inference_mode():  # warm every shape on the capture stream
        for frames in (5, 30):
            for batch in (1, 2, 3):
                dec(torch.zeros(batch, frames, 8, dtype=torch.int64, device="cuda"))
    first, ramp = WindowShape(5, 0, 1), WindowShape(30, 1, 26)  # the streaming window's first two
    graphs = CodecGraphs(dec, torch.device("cuda"), stream, num_codebooks=8, samples_per_frame=HOP)
    graphs.capture((first, ramp), batch_sizes=(1, 2, 3))
    assert graphs.shapes == [(first, 1), (first, 2), (first, 3), (ramp, 1), (ramp, 2), (ramp, 3)]
    for (batch, shape), seed in [((1, first), 0), ((3, ramp), 1), ((2, ramp), 2), ((3, first), 3)]:
        codes = _codes(batch, shape.frames, seed)
        eager = runner.decode_batch(codes, shape)  # runner without graphs: eager
        with torch.cuda.stream(stream):
            replayed = graphs.replay(torch.from_numpy(codes), shape).cpu().numpy()
        peak = float(np.abs(eager).max())
        diff = float(np.abs(replayed - eager).max())
        print(f"\n{dtype} B={batch} {shape}: max |graph - eager| = {diff:.2e} (peak {peak:.2f})")
        assert replayed.shape == (batch, shape.kept_frames * HOP)
        assert diff <= 1e-6 * max(peak, 1.0)


def test_a_batch_between_captured_sizes_replays_the_next_larger_one():
    """Padding: batches of 2 and 3 replay the batch-4 graph; its extra rows hold whatever codes an
    earlier replay left and change nothing in the rows returned."""
    dec = _decoder()
    runner = CodecRunner(dec, torch.device("cuda"), max_batch_windows=4, samples_per_frame=HOP)  # eager
    stream = torch.cuda.Stream()
    steady = WindowShape(39, 10, 35)
    with torch.cuda.stream(stream), torch.inference_mode():
        for batch in (1, 4):
            dec(torch.zeros(batch, steady.frames, 8, dtype=torch.int64, device="cuda"), steady.keep)
    graphs = CodecGraphs(dec, torch.device("cuda"), stream, num_codebooks=8, samples_per_frame=HOP)
    graphs.capture((steady,), batch_sizes=(1, 4))
    assert graphs.serves(3, steady) and not graphs.serves(5, steady)
    assert not graphs.serves(1, WindowShape(39, 10, 39))
    for batch, seed in [(4, 0), (3, 1), (2, 2), (4, 3), (1, 4)]:
        codes = _codes(batch, steady.frames, seed)
        with torch.cuda.stream(stream):
            replayed = graphs.replay(torch.from_numpy(codes), steady).cpu().numpy()
        eager = runner.decode_batch(codes, steady)
        assert replayed.shape == eager.shape == (batch, steady.kept_frames * HOP)
        # cuDNN may pick another algorithm for a batch of 4 than for 3 or 2
        np.testing.assert_allclose(replayed, eager, rtol=0, atol=1e-4 * max(float(np.abs(eager).max()), 1.0))
    assert graphs.num_captures == 2


@pytest.mark.parametrize("keep", [(10, 35), (25, 50), (0, 1), (1, 26), (10, 39)], ids=str)
def test_decoding_only_the_kept_frames_equals_cutting_a_whole_window_decode(keep):
    """The real geometry on cuDNN in float32: the narrowed decode (`decoder.decode_range`) gives
    the kept frames of a whole-window decode, to float rounding (cuDNN picks its algorithm per
    length)."""
    dec = _decoder()
    frames = 54 if keep[1] > 39 else 39
    codes = torch.from_numpy(_codes(4, frames, 7)).cuda()
    with torch.inference_mode():
        whole = dec(codes)[:, keep[0] * HOP : keep[1] * HOP]
        kept = dec(codes, keep)
    assert kept.shape == whole.shape
    diff = float((kept - whole).abs().max())
    print(f"\nkeep {keep} of {frames}: max |kept - whole| = {diff:.2e} (peak {float(whole.abs().max()):.2f})")
    assert diff <= 2e-6 * max(float(whole.abs().max()), 1.0)


def test_runner_replays_warmed_shapes_and_captures_nothing_new():
    dec = _decoder()
    runner = CodecRunner(dec, torch.device("cuda"), max_batch_windows=4, samples_per_frame=HOP, cuda_graphs=True)
    eager = CodecRunner(dec, torch.device("cuda"), max_batch_windows=4, samples_per_frame=HOP)
    first, steady = WindowShape(5, 0, 1), WindowShape(54, 25, 50)
    seconds = runner.warm_up((first, steady), num_codebooks=8)
    graphs = runner.graphs
    assert graphs is not None and seconds > 0
    assert graphs.num_captures == 8
    assert graphs.shapes == [(first, b) for b in range(1, 5)] + [(steady, b) for b in range(1, 5)]
    replays = graphs.num_replays
    for batch, shape in [(1, first), (4, steady), (3, steady), (1, steady)]:
        codes = _codes(batch, shape.frames, batch * 100 + shape.frames)
        got = runner.decode_batch(codes, shape)
        want = eager.decode_batch(codes, shape)
        assert np.abs(got - want).max() <= 1e-6 * max(float(np.abs(want).max()), 1.0)
    assert graphs.num_replays == replays + 4 and graphs.num_captures == 8  # replayed, nothing captured
    # shapes that were not warmed up (a final window of 7 frames; a 54-frame final window, which
    # keeps its last frames too) decode eagerly
    for codes, shape in [(_codes(2, 7, 9), None), (_codes(2, 54, 10), WindowShape(54, 25, 54))]:
        np.testing.assert_allclose(runner.decode_batch(codes, shape), eager.decode_batch(codes, shape), rtol=0, atol=1e-6)
    assert graphs.num_replays == replays + 4 and graphs.num_captures == 8


def test_runner_with_graphs_keeps_order_and_trims():
    """The threaded path on graphs: per-request order and trimming as with eager decode."""
    from higgs_serve.codec.codec_runner import CodecJob

    dec = _decoder()
    runner = CodecRunner(dec, torch.device("cuda"), max_batch_windows=2, samples_per_frame=HOP, cuda_graphs=True)
    runner.warm_up((WindowShape(5, 1, 5),), num_codebooks=8)
    eager = CodecRunner(dec, torch.device("cuda"), max_batch_windows=2, samples_per_frame=HOP)
    log: list = []

    def deliver(job, audio, error=None):
        assert error is None
        log.append((job.request_id, job.frames, audio))

    jobs = [CodecJob(rid, _codes(1, n, i)[0], 1 if n == 5 else 0, 0, False, deliver)
            for i, (rid, n) in enumerate([("a", 5), ("b", 5), ("a", 9), ("c", 5)])]
    runner.start()
    try:
        for job in jobs:
            runner.submit(job)
    finally:
        runner.stop()
    assert len(log) == 4 and [len(f) for r, f, _ in log if r == "a"] == [5, 9]
    for _, frames, audio in log:
        want = eager.decode_batch(frames[None])[0]
        want = want[HOP:] if len(frames) == 5 else want
        # a window decoded in a batch of 2 against alone: cuDNN may pick another algorithm per batch
        np.testing.assert_allclose(audio, want, rtol=0, atol=1e-4 * max(float(np.abs(want).max()), 1.0))
    assert runner.graphs.num_replays >= 1


def test_gemm_convs_decode_what_cudnn_decodes():
    """float32 on CUDA: the wide residual-unit convs as GEMMs (`decoder.conv7_gemm`, the
    decoder's default there) against every conv on cuDNN, same real-geometry window."""
    dec = _decoder()
    assert dec.gemm_conv_min_channels is not None
    codes = torch.from_numpy(_codes(3, 39, 11)).cuda()
    with torch.inference_mode():
        gemm = dec(codes, (10, 35))
        dec.gemm_conv_min_channels = None
        cudnn = dec(codes, (10, 35))
    diff = float((gemm - cudnn).abs().max())
    print(f"\nmax |gemm - cudnn| = {diff:.2e} (peak {float(cudnn.abs().max()):.2f})")
    assert diff <= 2e-6 * max(float(cudnn.abs().max()), 1.0)


def test_the_triton_split_conv_is_the_gemm_form():
    check_conv_split("cuda")


@pytest.mark.parametrize("min_channels", [256, 0])
def test_bf16x3_decodes_the_float64_audio_and_replays_in_a_graph(min_channels):
    """The "bf16x3" precision (split_conv.py: residual-unit convs as split bf16 GEMMs on the tensor
    cores, float32 out) on the real geometry: within 3e-5 of peak of a float64 decode (float32's own
    error is ~4e-6, TF32's ~2e-3), and a captured graph replays what the eager decode computes."""
    cfg = CodecConfig()
    tensors = random_codec_tensors(cfg, seed=1)
    dec = CodecDecoder(cfg).to(device="cuda").use_precision("bf16x3").eval()
    dec.split_conv_min_channels = min_channels  # 0 (the default): every unit split, narrow ones on the Triton kernel
    dec.load_state(tensors)
    ref = CodecDecoder(cfg).to(device="cuda", dtype=torch.float64).eval()
    ref.load_state(tensors)
    shape = WindowShape(39, 10, 35)
    codes = torch.from_numpy(_codes(3, shape.frames, 11)).cuda()
    stream = torch.cuda.Stream()
    with torch.inference_mode(), torch.cuda.stream(stream):
        want = ref(codes, shape.keep)
        got = dec(codes, shape.keep)
    stream.synchronize()
    peak = float(want.abs().max())
    err = float((got.double() - want).abs().max())
    print(f"\nbf16x3 (split from {min_channels} channels): max |decode - float64| = {err:.2e} (peak {peak:.2f})")
    assert err <= 3e-5 * max(peak, 1.0)
    graphs = CodecGraphs(dec, torch.device("cuda"), stream, num_codebooks=8, samples_per_frame=HOP)
    graphs.capture((shape,), batch_sizes=(3,))
    with torch.cuda.stream(stream):
        replayed = graphs.replay(codes.cpu(), shape).clone()
    stream.synchronize()
    assert float((replayed - got).abs().max()) <= 1e-6 * max(peak, 1.0)


def test_a_stream_whose_first_chunk_grew_with_the_load_replays_only_warmed_graphs():
    """Issue 53: the deadline policy may start a stream with a larger first chunk
    (codec/chunker.py `ramp_first_chunks`); the engine warms up `first_chunk_shapes` beside the
    profile's, so every window of such a stream replays a captured graph (none plans a new shape
    while other streams wait)."""
    params = WindowParams()  # the shipped window
    shapes = tuple(sorted({*warm_window_shapes(params), *first_chunk_shapes(params)}))
    runner = CodecRunner(_decoder(), torch.device("cuda"), max_batch_windows=2, samples_per_frame=HOP,
                         cuda_graphs=True)
    runner.warm_up(shapes, num_codebooks=8)
    captured = runner.graphs.num_captures
    for first in ramp_first_chunks(params):
        chunker = StreamChunker(replace(params, initial_chunk_frames=first))
        replays = runner.graphs.num_replays
        windows = [w for d in range(1, 120) if (w := chunker.push(d, finished=False)) is not None]
        for window in windows:
            runner.decode_batch(_codes(1, window.num_frames, first), window.shape)
        assert runner.graphs.num_replays == replays + len(windows), first
    assert runner.graphs.num_captures == captured
