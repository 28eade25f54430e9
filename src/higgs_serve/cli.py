"""`higgs-serve` command line: synth, serve, bench, config show, make-tiny-model, encode-voice."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from higgs_serve.errors import HiggsServeError

logger = logging.getLogger("higgs_serve")


# ---------------------------------------------------------------------------- shared options
def _add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--load-format", choices=["auto", "dummy"], default="auto",
                   help="dummy: build the model from config.json alone with random weights")
    p.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda when available)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                   help="talker dtype (default: bfloat16 on CUDA, float32 on CPU)")
    _add_deploy_options(p)


def _add_deploy_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--deploy-config", default=None,
                   help="a deploy YAML path or the bare name of a shipped profile "
                        "(default: discovered from the model's model_type)")
    p.add_argument("--stage-overrides", default=None, help='JSON, e.g. \'{"0": {"max_num_seqs": 4}}\'')
    p.add_argument("--max-num-seqs", type=int, default=None, help="Stage 0 max_num_seqs (overrides the YAML)")
    p.add_argument("--kv-cache-dtype", default=None,
                   help="Stage 0 kv_cache_dtype: auto (the model dtype) or fp8 (alias fp8_e4m3); overrides the YAML")


def deploy_from_args(args: argparse.Namespace, model_dir: Path):
    """The deploy config the command-line flags select (--deploy-config, --stage-overrides,
    --max-num-seqs, --device, --kv-cache-dtype; absent attributes count as not given)."""
    import torch

    from higgs_serve.deploy_loader import load_deploy_config
    from higgs_serve.model.hf_config import load_model_spec

    spec = load_model_spec(model_dir)
    cli: dict = {}
    device = getattr(args, "device", None)
    if device == "cpu" or (device is None and not torch.cuda.is_available()):
        cli.setdefault("0", {})["devices"] = "cpu"
        cli.setdefault("1", {})["devices"] = "cpu"
    kv_cache_dtype = getattr(args, "kv_cache_dtype", None)
    if kv_cache_dtype is not None:  # validated with the rest of the config, like every key
        cli.setdefault("0", {})["kv_cache_dtype"] = kv_cache_dtype

    def load(overrides: dict, stage_overrides=args.stage_overrides):
        return load_deploy_config(args.deploy_config, spec.model_type, stage_overrides=stage_overrides,
                                  cli_overrides=overrides or None, device_count=torch.cuda.device_count())

    max_num_seqs = getattr(args, "max_num_seqs", None)
    if max_num_seqs is None:
        return load(cli)
    # --max-num-seqs also fits what the YAML sized for its own max_num_seqs (capture sizes, token
    # budget) to the new bound, unless --stage-overrides sets those keys itself.
    given = _stage0_keys(args.stage_overrides)
    profile = load(cli, stage_overrides=None).stage0
    stage0 = cli.setdefault("0", {})
    stage0["max_num_seqs"] = max_num_seqs
    if "cudagraph_capture_sizes" not in given.get("compilation_config", {}):
        compilation = profile.compilation_config
        sizes = [s for s in compilation.cudagraph_capture_sizes if s < max_num_seqs] + [max_num_seqs]
        if compilation.cudagraph_mode.piecewise:  # the token counts above the batch sizes stay
            sizes += [s for s in compilation.cudagraph_capture_sizes if s > max(max_num_seqs, profile.max_num_seqs)]
        stage0["compilation_config"] = {"cudagraph_capture_sizes": sizes}
    if "max_num_batched_tokens" not in given:
        stage0["max_num_batched_tokens"] = max(max_num_seqs, profile.max_num_batched_tokens)
    return load(cli)


def _stage0_keys(stage_overrides: str | None) -> dict:
    """Stage 0's part of --stage-overrides (malformed JSON is reported by the config loader)."""
    if not stage_overrides:
        return {}
    try:
        parsed = json.loads(stage_overrides)
    except json.JSONDecodeError:
        return {}
    stage0 = parsed.get("0", {}) if isinstance(parsed, dict) else {}
    return stage0 if isinstance(stage0, dict) else {}


def _runtime_options(args: argparse.Namespace, **extra):
    from higgs_serve.engine.builder import RuntimeOptions

    return RuntimeOptions(load_format=args.load_format, device=args.device, dtype=args.dtype, **extra)


def _log_graph_path(deploy) -> None:
    import torch

    from higgs_serve.deploy_config import resolve_graph_path

    path, reason = resolve_graph_path(deploy.stage0, torch.cuda.is_available())
    logger.info("Stage 0 graph path: %s (%s)", path.value, reason)


# ---------------------------------------------------------------------------- synth
def _cmd_synth(args: argparse.Namespace) -> int:
    import numpy as np

    from higgs_serve.engine.async_engine import SyncEngine
    from higgs_serve.engine.speech import SpeechRequest
    from higgs_serve.model.checkpoint import resolve_model_dir
    from higgs_serve.sampling_params import SamplingParams

    model_dir = resolve_model_dir(args.model)
    deploy = deploy_from_args(args, model_dir)
    _log_graph_path(deploy)
    overrides = {k: v for k, v in dict(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
        max_new_tokens=args.max_new_tokens, min_new_tokens=args.min_new_tokens).items() if v is not None}
    sampling = SamplingParams.from_defaults(deploy.stage0.default_sampling_params, **overrides)
    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.ref_text is not None and args.ref_audio is None:
        raise HiggsServeError("--ref-text is the transcript of --ref-audio: give --ref-audio too")
    engine = SyncEngine.from_model(str(model_dir), deploy, _runtime_options(args))
    try:
        reference = _reference_from_file(args.ref_audio, args.ref_text, engine.loaded) if args.ref_audio else None
        requests = [SpeechRequest(f"{i:04d}", text, sampling, stream=args.stream, reference=reference)
                    for i, text in enumerate(args.text)]
        stream_files = {r.request_id: open(out_dir / f"{r.request_id}.stream.f32", "wb") for r in requests} if args.stream else {}

        def on_chunk(request_id: str, chunk) -> None:
            if request_id in stream_files:
                stream_files[request_id].write(chunk.audio.astype(np.float32).tobytes())
                stream_files[request_id].flush()

        t0 = time.perf_counter()
        results = engine.generate_batch(requests, on_chunk=on_chunk)
        wall = time.perf_counter() - t0
        for f in stream_files.values():
            f.close()
        spf = engine.loaded.spec.codec.hop_length
        sr = engine.loaded.spec.codec.sample_rate
        for res in results:
            _write_result(out_dir, res, sr)
            seconds = len(res.audio) / sr
            line = (f"{res.request_id}: {len(res.frames)} frames, {seconds:.2f} s audio, "
                    f"finish={res.finish_reason}, wall {wall:.2f} s")
            if args.stream:
                line += _stream_check(engine, out_dir, res, spf)
            print(line, flush=True)
    finally:
        engine.close()
    return 0


def _write_result(out_dir: Path, res, sample_rate: int) -> None:
    import numpy as np
    import soundfile as sf

    sf.write(out_dir / f"{res.request_id}.wav", res.audio, sample_rate, subtype="PCM_16")
    np.savez(out_dir / f"{res.request_id}.npz", rows=res.rows.astype(np.int64),
             frames=res.frames.astype(np.int64), audio=res.audio.astype(np.float32))


def _stream_check(engine, out_dir: Path, res, samples_per_frame: int) -> str:
    """Streamed chunks must concatenate to the final audio; report the seam error against a
    one-shot decode of all frames (SPEC §1.9)."""
    import numpy as np

    streamed = np.fromfile(out_dir / f"{res.request_id}.stream.f32", dtype=np.float32)
    if not np.array_equal(streamed, res.audio):
        raise HiggsServeError(f"{res.request_id}: streamed chunks do not concatenate to the final audio")
    if len(res.frames) == 0:
        return ", stream ok"
    oneshot = engine.core.codec.decode_batch(res.frames[None])[0]
    err = float(np.max(np.abs(oneshot - res.audio))) if len(oneshot) == len(res.audio) else float("inf")
    peak = float(np.max(np.abs(oneshot))) or 1.0
    return f", stream ok ({len(res.chunks)} chunks, max seam error vs one-shot {err:.2e} = {err / peak:.2e} of peak)"


# ---------------------------------------------------------------------------- voice cloning
def _encode_file(path: str, loaded):
    """Reference audio file -> (codes [T, 8] int64, encoder) with the model's codec encoder."""
    from higgs_serve.voices.reference_encoder import ReferenceEncoder

    file = Path(path)
    if not file.is_file():
        raise HiggsServeError(f"reference audio file {path} does not exist")
    encoder = ReferenceEncoder.from_loaded(loaded)
    return encoder.encode_bytes(file.read_bytes(), param=str(file)), encoder


def _reference_from_file(path: str, ref_text: str | None, loaded):
    from higgs_serve.voices.reference_encoder import reference_audio

    codes, _ = _encode_file(path, loaded)
    logger.info("reference %s: %d frames", path, len(codes))
    return reference_audio(codes, ref_text)


def _cmd_encode_voice(args: argparse.Namespace) -> int:
    import numpy as np

    from higgs_serve.engine.builder import RuntimeOptions, load_model

    loaded = load_model(args.model, RuntimeOptions(load_format=args.load_format, device=args.device))
    codes, encoder = _encode_file(args.file, loaded)
    np.save(args.output, codes)
    print(f"wrote {args.output}: codes [{len(codes)}, {codes.shape[1]}] int64 "
          f"({len(codes) / 25:.2f} s of reference), encoder {encoder.encode_seconds:.2f} s", flush=True)
    return 0


# ---------------------------------------------------------------------------- serve
def _cmd_serve(args: argparse.Namespace) -> int:
    from higgs_serve.model.checkpoint import resolve_model_dir
    from higgs_serve.server.app import run_server
    from higgs_serve.server.settings import ServerSettings

    model_dir = resolve_model_dir(args.model)
    deploy = deploy_from_args(args, model_dir)
    if args.data_parallel_size is not None or args.devices:
        return _serve_data_parallel(args, model_dir, deploy)
    _log_graph_path(deploy)
    settings = ServerSettings(
        host=args.host, port=args.port, api_key=args.api_key, served_model_name=args.served_model_name,
        model_aliases=(args.model,), max_queue=args.max_queue, max_input_chars=args.max_input_chars,
        allowed_ref_audio_domains=tuple(h.strip() for h in args.allowed_ref_audio_domains.split(",") if h.strip()),
        **({"voices_dir": Path(args.voices_dir)} if args.voices_dir else {}),
    )
    # run_server adds str(model_dir) to the aliases and sizes the engine's waiting bound
    run_server(str(model_dir), settings, deploy, _runtime_options(args))
    return 0


def _serve_data_parallel(args: argparse.Namespace, model_dir: Path, deploy) -> int:
    """One engine process per device behind one front end (higgs_serve.cluster)."""
    import torch

    from higgs_serve.cluster.launch import ClusterPlan, plan_devices, run_cluster
    from higgs_serve.model.hf_config import load_model_spec
    from higgs_serve.server.settings import DEFAULT_VOICES_DIR

    devices = plan_devices(args.data_parallel_size, args.devices, args.device,
                           torch.cuda.device_count())
    plan = ClusterPlan(devices, capacity=deploy.stage0.max_num_seqs + args.max_queue,
                       routing=args.routing)
    # every single-server flag except where it listens, its key and its voices directory
    # (the front end owns those); the device comes from the plan
    passed = {"--served-model-name": args.served_model_name, "--max-queue": args.max_queue,
              "--max-input-chars": args.max_input_chars,
              "--allowed-ref-audio-domains": args.allowed_ref_audio_domains,
              "--load-format": args.load_format, "--dtype": args.dtype,
              "--deploy-config": args.deploy_config, "--stage-overrides": args.stage_overrides,
              "--max-num-seqs": args.max_num_seqs, "--kv-cache-dtype": args.kv_cache_dtype}
    serve_args = [str(x) for flag, value in passed.items() if value not in (None, "")
                  for x in (flag, value)]
    run_cluster(plan, str(model_dir), serve_args, host=args.host, port=args.port,
                voices_dir=Path(args.voices_dir) if args.voices_dir else DEFAULT_VOICES_DIR,
                sample_rate_hz=load_model_spec(model_dir).codec.sample_rate,
                api_key=args.api_key, log_level=args.log_level)
    return 0


# ---------------------------------------------------------------------------- config show
def _cmd_config_show(args: argparse.Namespace) -> int:
    import torch

    from higgs_serve.model.checkpoint import resolve_model_dir

    deploy = deploy_from_args(args, resolve_model_dir(args.model))
    print(json.dumps(deploy.to_dict(cuda_available=torch.cuda.is_available()), indent=2))
    return 0


# ---------------------------------------------------------------------------- make-tiny-model
def _cmd_make_tiny_model(args: argparse.Namespace) -> int:
    from higgs_serve.model.tiny import write_tiny_model

    write_tiny_model(Path(args.dir), seed=args.seed, preset=args.preset, config_only=args.config_only)
    what = "config.json and tokenizer" if args.config_only else "checkpoint"
    print(f"wrote {args.preset} {what} to {args.dir}")
    return 0


# ---------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    from higgs_serve.server.settings import ServerSettings  # its defaults are the flags' defaults

    parser = argparse.ArgumentParser(prog="higgs-serve", description=__doc__)
    parser.add_argument("--log-level", default="INFO")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("synth", help="synthesize speech offline into WAV + NPZ files")
    p.add_argument("--model", required=True, help="model directory or hub id")
    p.add_argument("--text", action="append", required=True, help="text to speak (repeatable)")
    p.add_argument("--output-dir", required=True)
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--max-new-tokens", type=int, help="frame cap per request (25 frames = 1 s)")
    p.add_argument("--min-new-tokens", type=int, help="frames before the model may stop (benchmarks)")
    p.add_argument("--stream", action="store_true",
                   help="stream chunks to OUT/NNNN.stream.f32 as they arrive and check them against the final audio")
    p.add_argument("--ref-audio", default=None, help="clone this voice (wav/flac/ogg/mp3, 0.5-30 s) for every --text")
    p.add_argument("--ref-text", default=None, help="transcript of --ref-audio (optional)")
    _add_model_options(p)
    p.set_defaults(func=_cmd_synth)

    p = sub.add_parser("encode-voice", help="encode a reference clip into codec codes (.npy, [T, 8] int64)")
    p.add_argument("file", help="reference audio (wav/flac/ogg/mp3, 0.5-30 s)")
    p.add_argument("-o", "--output", required=True, help="where to write the codes (.npy)")
    p.add_argument("--model", required=True, help="model directory or hub id (its bundled codec encodes)")
    p.add_argument("--load-format", choices=["auto", "dummy"], default="auto")
    p.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda when available)")
    p.set_defaults(func=_cmd_encode_voice)

    p = sub.add_parser("serve", help="run the OpenAI-compatible HTTP server")
    p.add_argument("model", help="model directory or hub id")
    p.add_argument("--host", default=ServerSettings.host)
    p.add_argument("--port", type=int, default=ServerSettings.port)
    p.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` on /v1/*")
    p.add_argument("--served-model-name", default=ServerSettings.served_model_name)
    p.add_argument("--max-queue", type=int, default=ServerSettings.max_queue,
                   help="requests allowed to wait; past it, 429")
    p.add_argument("--max-input-chars", type=int, default=ServerSettings.max_input_chars)
    p.add_argument("--voices-dir", default=None, help="where registered voices persist")
    p.add_argument("--allowed-ref-audio-domains", default="",
                   help="comma-separated hosts whose http(s) URLs may be given as ref_audio")
    p.add_argument("--data-parallel-size", type=int, default=None,
                   help="run N engine replicas (one per GPU, or N CPU replicas with --device cpu) "
                        "behind one front end on --host/--port")
    p.add_argument("--devices", default=None,
                   help="GPU indices of the replicas, e.g. 0,1,2,3 (a repeated index shares a GPU)")
    p.add_argument("--routing", choices=["affinity", "least-loaded"], default="affinity",
                   help="with several replicas: route a voice to the replica that has it cached "
                        "(affinity) or every request to the less loaded of two (least-loaded)")
    _add_model_options(p)
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser("config", help="deploy config tools")
    csub = p.add_subparsers(dest="config_command", required=True)
    show = csub.add_parser("show", help="print the fully resolved deploy config as JSON")
    show.add_argument("model", help="model directory or hub id")
    show.add_argument("--device", default=None)
    _add_deploy_options(show)
    show.set_defaults(func=_cmd_config_show)

    p = sub.add_parser("make-tiny-model", help="write a small random checkpoint in the real layout")
    p.add_argument("dir")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--preset", choices=["tiny", "4b"], default="tiny")
    p.add_argument("--config-only", action="store_true", help="write config.json and tokenizer only (for --load-format dummy)")
    p.set_defaults(func=_cmd_make_tiny_model)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except HiggsServeError as exc:
        print(f"higgs-serve: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
