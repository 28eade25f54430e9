"""Stage 0 and Stage 1 on one GPU: how much of the codec's GPU time hides behind decode steps.

A round is `--steps` Stage 0 decode steps at batch B (replays of the full decode graph on the
runner's high-priority step stream) plus the codec windows those steps produce: B x steps frames
= B x steps / new-frames windows of `--window` frames, decoded in calls of `--codec-batch` windows
(codec graph replays, float32 unless `--codec-dtype` says otherwise), as the engine does at
steady state. Modes (`--modes`):

  stage0    the steps alone
  codec     the codec calls alone
  serial    both on one stream, one after the other (no overlap: the sum)
  streams   both at once on the engine's two streams (steps at high priority, codec default)
  green:K   both at once, the codec's stream in a CUDA green context of K SMs, its graph
            captured on that stream (its kernels can use only those SMs; Stage 0 keeps the whole
            GPU and its priority)
  codec:K   the codec calls alone in a green context of K SMs (what the codec loses there)
  paced, paced:K   as streams / green:K, but the host waits for each step before launching the one
            after next, as the engine's one-step lookahead does

Each mode enqueues `--rounds` rounds with no host waits between them, then synchronizes, so the
GPU always has both queues in front of it: the best overlap the two streams allow. Reported: ms a
round and audio s/s (B x steps x 40 ms of audio a round). CUDA only.

  PYTHONPATH=src python3 benchmarks/step/bench_overlap.py --model /tmp/h4b --out overlap.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from codec.bench_codec import build_decoder, _graphs, window_shape  # noqa: E402
from step.bench_step import BenchShape, PlanMaker, build_runner, graph_policy_for  # noqa: E402
from common import command_line, device_description, git_commit, markdown_table, now_iso, write_json  # noqa: E402

from higgs_serve.codec.chunker import WindowShape  # noqa: E402
from higgs_serve.codec.codec_graphs import CodecGraphs  # noqa: E402
from higgs_serve.engine.builder import RuntimeOptions, load_model  # noqa: E402
from higgs_serve.model.tiny import build_dummy_tensors  # noqa: E402


def green_stream(num_sms: int, device: torch.device) -> tuple[object, torch.cuda.Stream]:
    """A stream in a CUDA green context of `num_sms` SMs (the context must stay alive)."""
    from torch.cuda.green_contexts import GreenContext
    try:
        ctx = GreenContext.create(num_sms=num_sms, device_id=device.index or 0)
    except TypeError:  # torch before 2.12 takes them positionally
        ctx = GreenContext.create(num_sms, device.index or 0)
    return ctx, ctx.Stream()


class Round:
    """Enqueues one round's Stage 0 steps and codec calls on the streams it is given."""

    def __init__(self, step_graph: torch.cuda.CUDAGraph, steps: int, graphs: CodecGraphs, codes: torch.Tensor,
                 shape: WindowShape, calls: int):
        self.step_graph, self.steps = step_graph, steps
        self.graphs, self.codes, self.shape, self.calls = graphs, codes, shape, calls

    def stage0(self, stream: torch.cuda.Stream, paced: bool = False) -> None:
        """`paced`: the host waits for step k - 1 after launching step k, as the engine's
        one-step lookahead does (its next plan needs the last step's tokens)."""
        previous = None
        with torch.cuda.stream(stream):
            for _ in range(self.steps):
                self.step_graph.replay()
                if paced:
                    done = torch.cuda.Event()
                    done.record(stream)
                    if previous is not None:
                        previous.synchronize()
                    previous = done

    def codec(self, stream: torch.cuda.Stream, graphs: CodecGraphs | None = None) -> None:
        graphs = graphs or self.graphs
        with torch.cuda.stream(stream):
            for _ in range(self.calls):
                graphs.replay(self.codes, self.shape)


def probe_green(dec, codes: torch.Tensor, device: torch.device, num_sms: int) -> dict:
    """Does the codec run on a green-context stream as the runner would run it there: eagerly,
    and as a graph captured on that stream? Max abs difference of each against a plain stream."""
    ref = dec(codes).float()
    _context, stream = green_stream(num_sms, device)
    with torch.cuda.stream(stream):
        eager = dec(codes).float()
    stream.synchronize()
    batch, frames, _ = codes.shape
    whole = WindowShape(frames, 0, frames)
    graphs = _graphs(dec, device, [whole], [batch], codes, ref.shape[-1] // frames, stream)
    with torch.cuda.stream(stream):
        replayed = graphs.replay(codes, whole).clone()
    stream.synchronize()
    return {"eager_max_abs_diff": (eager - ref).abs().max().item(),
            "captured_max_abs_diff": (replayed - ref).abs().max().item()}


def time_mode(fn, rounds: int, device: torch.device) -> float:
    """Seconds a round: `fn()` enqueues one round; all rounds are enqueued, then one sync."""
    fn()
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(rounds):
        fn()
    torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) / rounds


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="model dir (a 4B config: random weights)")
    ap.add_argument("--batch", type=int, default=64, help="Stage 0 decode batch")
    ap.add_argument("--context", type=int, default=200, help="tokens each request has cached")
    ap.add_argument("--steps", type=int, default=25, help="Stage 0 steps a round")
    ap.add_argument("--window", type=int, default=39, help="codec window frames (L + C + H)")
    ap.add_argument("--new-frames", type=int, default=25, help="frames a window adds to its stream (C)")
    ap.add_argument("--keep", choices=["new", "window"], default="new",
                    help="the codec decodes only what the new frames need (the runner) or the whole window")
    ap.add_argument("--codec-batch", type=int, default=16, help="windows per codec call (max_batch_windows)")
    ap.add_argument("--codec-dtype", choices=["float32", "tf32", "bfloat16"], default="float32")
    ap.add_argument("--modes", nargs="+", default=["stage0", "codec", "serial", "streams", "green:32", "green:48", "green:64",
                                                   "green:80", "green:96", "codec:64", "codec:96"])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_overlap: needs a CUDA device (it times GPU streams and green contexts)")
    device = torch.device("cuda")
    windows = args.batch * args.steps // args.new_frames
    if windows % args.codec_batch:
        raise SystemExit(f"a round makes {windows} windows: --codec-batch must divide it")
    loaded = load_model(args.model, RuntimeOptions(load_format="dummy", device="cuda"))
    shape = BenchShape(batches=(args.batch,), contexts=(args.context,), block_size=16, max_num_batched_tokens=4096,
                       max_model_len=8192)
    runner = build_runner(loaded, graph_policy_for("full_graph", shape.batches, device, 4096), shape)
    runner.capture_graphs()
    plans = PlanMaker(shape, loaded.spec.text.vocab_size)
    for plan in plans.prefill_plans(args.context, ()):
        runner.execute(plan)
    runner.execute(plans.decode_plan(args.batch, args.context))  # stages one decode step's inputs
    step_graph = runner._full_graphs.graphs[runner.graphs.dispatch(args.batch, True)[1]]  # a benchmark-only peek
    step_stream = runner._step_stream

    torch.backends.cudnn.allow_tf32 = args.codec_dtype == "tf32"
    _, codec_tensors = build_dummy_tensors(loaded.spec, dtype=torch.float32, device="cpu", seed=0)
    dec = build_decoder(loaded.spec, codec_tensors, args.codec_dtype, device)
    codes = torch.randint(0, 1024, (args.codec_batch, args.window, 8), device=device)
    window = window_shape(args.window, args.new_frames, 4, args.keep)

    def captured(stream: torch.cuda.Stream | None = None) -> CodecGraphs:
        return _graphs(dec, device, [window], [args.codec_batch], codes, loaded.spec.codec.hop_length, stream)

    graphs = captured()
    codec_stream = graphs.stream
    work = Round(step_graph, args.steps, graphs, codes, window, windows // args.codec_batch)

    greens: dict[int, tuple[object, torch.cuda.Stream, CodecGraphs]] = {}

    def green(k: int) -> tuple[torch.cuda.Stream, CodecGraphs]:
        """The codec's stream in a green context of k SMs, and graphs captured on it (a graph
        captured on another stream and replayed there was measured not to be confined)."""
        if k not in greens:
            context, stream = green_stream(k, device)
            greens[k] = (context, stream, captured(stream))
        return greens[k][1:]

    def run(mode: str):
        kind, _, k = mode.partition(":")
        if kind == "stage0":
            return lambda: work.stage0(step_stream)
        if kind == "codec" and not k:
            return lambda: work.codec(codec_stream)
        if kind == "codec":
            return lambda: work.codec(*green(int(k)))
        if kind == "serial":
            return lambda: (work.stage0(step_stream), work.codec(step_stream))
        if kind == "streams":
            return lambda: (work.codec(codec_stream), work.stage0(step_stream))
        if kind == "green":
            return lambda: (work.codec(*green(int(k))), work.stage0(step_stream))
        if kind == "paced" and not k:
            return lambda: (work.codec(codec_stream), work.stage0(step_stream, paced=True))
        if kind == "paced":
            return lambda: (work.codec(*green(int(k))), work.stage0(step_stream, paced=True))
        raise SystemExit(f"unknown mode {mode!r}")

    try:
        probe = probe_green(dec, codes, device, 32)
    except (RuntimeError, AttributeError, ImportError) as exc:
        probe = {"error": str(exc)}
    print(f"green-context probe (32 SMs): {probe}", flush=True)
    audio_s = args.batch * args.steps * 0.04
    rows = []
    for mode in args.modes:
        try:
            seconds = time_mode(run(mode), args.rounds, device)
        except (RuntimeError, AttributeError, ImportError) as exc:  # no green contexts in this torch/driver
            print(f"{mode}: failed: {exc}", flush=True)
            rows.append({"mode": mode, "error": str(exc)})
            continue
        rows.append({"mode": mode, "ms_per_round": seconds * 1e3, "audio_s_per_s": audio_s / seconds})
        print(f"{mode:10s} {seconds * 1e3:8.2f} ms a round  {audio_s / seconds:7.1f} audio s/s", flush=True)
    print(markdown_table([r for r in rows if "error" not in r],
                         [("mode", "mode"), ("ms_per_round", "ms a round"), ("audio_s_per_s", "audio s/s")]))
    if args.out:
        write_json(args.out, {"command": command_line(), "git_commit": git_commit(), "device": device_description(),
                              "torch": torch.__version__, "time": now_iso(), "settings": vars(args),
                              "windows_per_round": windows, "green_probe": probe, "rows": rows})


if __name__ == "__main__":
    main()
