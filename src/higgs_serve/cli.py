"""`higgs-serve` command line: synth, serve, encode-voice, detect, config show, make-tiny-model.

One convention for every command: the model comes first (MODEL: a directory or a hub id;
`--model MODEL` is the same argument, kept for older scripts), global flags (`--log-level`) go
before or after the command, every flag's help shows its default. Each command checks its
flags before it loads anything (`preflight.py`); a user error ends in one `higgs-serve: error:`
line and exit status 2, never a traceback (`--log-level DEBUG` adds it). Ctrl-C exits at once,
also during a model load.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from higgs_serve import preflight
from higgs_serve.cli_options import (
    STAGE_OVERRIDES_EXAMPLE,
    HelpFormatter,
    add_config_show_flags,
    add_detect_flags,
    add_encode_voice_flags,
    add_make_tiny_model_flags,
    add_serve_flags,
    add_synth_flags,
    global_options,
)
from higgs_serve.errors import ConfigError, HiggsServeError
from higgs_serve.progress import ProgressReporter

logger = logging.getLogger("higgs_serve")

EXIT_USER_ERROR = 2  # argparse's status for a bad command line; ours for every user error
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what `cat` reports when `head` stops reading


def deploy_from_args(args: argparse.Namespace, model_dir: Path):
    """The deploy config the command-line flags select (--deploy-config, --stage-overrides,
    --max-num-seqs, --device, --kv-cache-dtype, --watermark; absent attributes count as not
    given). The precedence and the --max-num-seqs refit are the loader's (config/loader.py)."""
    import torch

    from higgs_serve.config.loader import load_for_command_line
    from higgs_serve.model.hf_config import load_model_spec

    device = getattr(args, "device", None)
    return load_for_command_line(
        args.deploy_config, load_model_spec(model_dir).model_type,
        stage_overrides=args.stage_overrides,
        force_cpu=device == "cpu" or (device is None and not torch.cuda.is_available()),
        kv_cache_dtype=getattr(args, "kv_cache_dtype", None),
        max_num_seqs=getattr(args, "max_num_seqs", None),
        watermark={"on": True, "off": False, None: None}[getattr(args, "watermark", None)],
        device_count=torch.cuda.device_count())


def _runtime_options(args: argparse.Namespace, **extra):
    from higgs_serve.engine.builder import RuntimeOptions

    return RuntimeOptions(load_format=args.load_format, device=args.device, dtype=args.dtype,
                          on_progress=ProgressReporter(unit="tensor"), **extra)


def _model_and_deploy(args: argparse.Namespace, load_format: str | None, generates: bool = False):
    """The model directory and the deploy config, checked (load_format None: no weights needed;
    `generates`: the command makes audio, so a watermark that is on must be available)."""
    from higgs_serve.model.checkpoint import resolve_model_dir

    preflight.check_device(getattr(args, "device", None))
    model_dir = resolve_model_dir(args.model)
    if load_format is not None:
        preflight.check_model_dir(model_dir, load_format)
    deploy = deploy_from_args(args, model_dir)
    if generates:
        # random weights everywhere with --load-format dummy: the watermark's network too
        preflight.check_watermark(deploy.watermark and load_format != "dummy")
    return model_dir, deploy


def _log_graph_path(deploy) -> None:
    import torch

    from higgs_serve.config.deploy import resolve_graph_mode

    mode, reason = resolve_graph_mode(deploy.stage0, torch.cuda.is_available())
    logger.info("Stage 0 graph mode: %s (%s)", mode.value, reason)


# ---------------------------------------------------------------------------- synth
def _cmd_synth(args: argparse.Namespace) -> int:
    from higgs_serve.engine.async_engine import SyncEngine
    from higgs_serve.engine.speech import SpeechRequest
    from higgs_serve.sampling_params import SamplingParams
    from higgs_serve.synth_report import SynthMonitor, WordsWriter, stream_check, synth_long_form, write_result

    preflight.check_texts(args.text)
    if args.word_timestamps:
        preflight.check_alignable(args.text)
    if args.segment_max_chars < 1 or args.max_audio_s <= 0:
        raise ConfigError("--segment-max-chars and --max-audio-s must be positive")
    long_text = next((i for i, text in enumerate(args.text) if len(text) > args.segment_max_chars), None)
    if args.stream and long_text is not None:
        raise ConfigError(f"--stream checks one request's chunks; text {long_text:04d} is longer than "
                          f"--segment-max-chars {args.segment_max_chars} (spoken as segments): drop --stream")
    if args.ref_text is not None and args.ref_audio is None and args.ref_codes is None:
        raise ConfigError("--ref-text is the transcript of --ref-audio / --ref-codes: give one of them too")
    if args.ref_codes is not None and args.ref_audio is not None:
        raise ConfigError("give --ref-audio or --ref-codes, not both")
    clip = preflight.read_reference_clip(args.ref_audio, "--ref-audio") if args.ref_audio else None
    coded = None
    if args.ref_codes is not None:  # checked before the model loads
        from higgs_serve.voices.codes_file import reference_from_codes_file
        coded = reference_from_codes_file(args.ref_codes, args.ref_text)
    out_dir = preflight.check_output_dir(args.output_dir, "--output-dir")
    ids = [f"{i:04d}" for i in range(len(args.text))]
    for request_id in ids:  # a directory in the way fails now, not after the synthesis
        for suffix in (".wav", ".npz") + ((".stream.f32",) if args.stream else ()) + (
                (".words.json",) if args.word_timestamps else ()):
            preflight.check_output_file(str(out_dir / f"{request_id}{suffix}"), "--output-dir")
    model_dir, deploy = _model_and_deploy(args, args.load_format, generates=True)
    overrides = {k: v for k, v in dict(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
        max_new_tokens=args.max_new_tokens, min_new_tokens=args.min_new_tokens).items() if v is not None}
    sampling = SamplingParams.from_defaults(deploy.stage0.default_sampling_params, **overrides)
    _log_graph_path(deploy)  # after every check: a bad flag is the first thing said
    engine = SyncEngine.from_model(str(model_dir), deploy, _runtime_options(args))
    try:
        reference = _encode_reference(clip, args.ref_audio, args.ref_text, engine.loaded) if clip else coded
        requests = [SpeechRequest(rid, text, sampling, stream=args.stream, reference=reference)
                    for rid, text in zip(ids, args.text)]
        sample_rate = engine.loaded.spec.codec.sample_rate
        long_texts = [r for r in requests if len(r.text) > args.segment_max_chars]  # one recording each
        requests = [r for r in requests if len(r.text) <= args.segment_max_chars]
        words = WordsWriter(out_dir, sample_rate) if args.word_timestamps else None
        long_form = synth_long_form(engine, long_texts, args.segment_max_chars, args.max_audio_s,
                                    out_dir, words, progress=ProgressReporter(unit="seg"))
        monitor = SynthMonitor(out_dir, [r.request_id for r in requests], sample_rate, stream=args.stream,
                               progress=ProgressReporter(unit="req"))
        try:
            results = engine.generate_batch(requests, on_chunk=monitor.on_chunk)
        finally:
            monitor.close()
        for res, request in zip(results, requests):
            paths = write_result(out_dir, res, sample_rate)
            if words is not None:  # after the batch: alignment never delays its audio
                paths.append(words.write(res.request_id, res.audio, [(request.text, 0, len(res.audio))]))
            note = stream_check(engine.core.codec, out_dir, res) if args.stream else ""
            print(monitor.line(res, paths, note), flush=True)
        print(monitor.summary(long_form), flush=True)
        if words is not None and words.failed_pieces:
            print(f"word timestamps: {words.failed_pieces} text(s) or segment(s) could not be aligned (audio too "
                  "short for their words): their words have null times", flush=True)
    finally:
        engine.close()
    return 0


# ---------------------------------------------------------------------------- voice cloning
def _encode_reference(clip, path: str, ref_text: str | None, loaded):
    from higgs_serve.voices.reference_encoder import ReferenceEncoder, reference_audio

    samples, rate = clip
    codes = ReferenceEncoder.from_loaded(loaded).encode(samples, rate, param=f"--ref-audio {path}")
    logger.info("reference %s: %d frames", path, len(codes))
    return reference_audio(codes, ref_text)


def _cmd_encode_voice(args: argparse.Namespace) -> int:
    import numpy as np

    from higgs_serve.engine.builder import load_model
    from higgs_serve.voices.reference_encoder import ReferenceEncoder

    samples, rate = preflight.read_reference_clip(args.file, "FILE")
    output = preflight.check_output_file(args.output, "--output")
    model_dir, deploy = _model_and_deploy(args, args.load_format)
    loaded = load_model(str(model_dir), _runtime_options(args), deploy)
    encoder = ReferenceEncoder.from_loaded(loaded)
    codes = encoder.encode(samples, rate, param=f"FILE {args.file}")
    with open(output, "wb") as f:  # exactly the path given (np.save on a name would append .npy)
        np.save(f, codes)
    print(f"wrote {output}: codes [{len(codes)}, {codes.shape[1]}] int64 "
          f"({len(codes) / loaded.spec.codec.frame_rate:.2f} s of reference), encoder {encoder.encode_seconds:.2f} s", flush=True)
    return 0


# ---------------------------------------------------------------------------- serve
def _cmd_serve(args: argparse.Namespace) -> int:
    from higgs_serve.server.settings import ServerSettings

    preflight.check_device(args.device)
    if args.data_parallel_size is not None or args.devices:
        return _serve_data_parallel(args)
    if args.mps:
        raise HiggsServeError("--mps shares a GPU between replicas: use it with --devices (e.g. --devices 0,0)")
    voices = {"voices_dir": preflight.check_output_dir(args.voices_dir, "--voices-dir")} if args.voices_dir else {}
    if args.uds:  # --port does not apply: the settings keep their default
        settings = _server_settings(args, ServerSettings.port, voices)
        sock = preflight.bind_unix_socket(args.uds)
        where = f"unix:{args.uds}"
    else:
        sock = preflight.bind_listen_socket(args.host, args.port)  # a port in use fails here, in milliseconds
        port = sock.getsockname()[1]  # the real one when --port 0
        settings = _server_settings(args, port, voices)
        where = f"http://{args.host}:{port}"
    provenance = preflight.load_provenance(settings)
    model_dir, deploy = _model_and_deploy(args, args.load_format, generates=True)
    _check_ttfa_budget(args, deploy)
    _log_graph_path(deploy)
    from higgs_serve.server.app import run_server  # seconds of imports (torch, FastAPI): after the checks

    logger.info("listening on %s; /ready answers 200 once the model is loaded and warm "
                "(Ctrl-C stops at any time)", where)
    # run_server adds str(model_dir) to the aliases and sizes the engine's waiting bound
    run_server(str(model_dir), settings, deploy, _runtime_options(args), sockets=[sock], provenance=provenance)
    return 0


def _check_ttfa_budget(args: argparse.Namespace, deploy) -> None:
    """--ttfa-budget-s is the deadline policy's: with the policy off nothing would apply it."""
    if args.ttfa_budget_s is not None and not deploy.stage0.deadlines.enabled:
        raise HiggsServeError("--ttfa-budget-s: the deploy config turns the deadline policy off "
                              "(stages[0].deadlines.enabled: false), which is what refuses streams past "
                              "the budget; drop the flag or turn the policy on")


def _server_settings(args: argparse.Namespace, port: int, voices: dict):
    from higgs_serve.server.settings import ServerSettings

    return ServerSettings(  # its checks (positive sizes, names, the key) run before anything loads
        host=args.host, port=port, api_key=args.api_key, served_model_name=args.served_model_name[0],
        extra_served_model_names=tuple(args.served_model_name[1:]),
        allowed_local_media_path=args.allowed_local_media_path, send_timeout_s=args.send_timeout_s,
        model_aliases=(args.model,), max_queue=args.max_queue,
        max_input_chars=args.max_input_chars,
        segment_max_chars=args.segment_max_chars, max_audio_s=args.max_audio_s,
        ws_idle_timeout_s=args.ws_idle_timeout_s, encode_threads=args.encode_threads,
        alignment_workers=args.alignment_workers, alignment_queue_s=args.alignment_queue_s,
        worker_timeout_s=args.worker_timeout_s, worker_cpus=args.worker_cpus,
        worker_nice=args.worker_nice, detect_wait_s=args.detect_wait_s,
        **({} if args.encode_processes is None else {"encode_processes": args.encode_processes}),
        **({} if args.ttfa_budget_s is None else {"ttfa_budget_s": args.ttfa_budget_s}),
        voice_aliases=preflight.read_voice_aliases(args.voice_alias),
        allowed_ref_audio_domains=tuple(h.strip() for h in args.allowed_ref_audio_domains.split(",") if h.strip()),
        c2pa_cert=args.c2pa_cert, c2pa_key=args.c2pa_key, c2pa_tsa_url=args.c2pa_tsa_url,
        playground=not args.no_playground,
        **voices,
    )


def _serve_data_parallel(args: argparse.Namespace) -> int:
    """One engine process per device behind one front end (higgs_serve.cluster)."""
    import torch

    from higgs_serve.cluster.launch import ClusterPlan, plan_devices, run_cluster
    from higgs_serve.cluster.mps import check_mps
    from higgs_serve.model.hf_config import load_model_spec
    from higgs_serve.server.settings import ServerSettings, default_encode_processes, default_worker_cpus

    if args.uds:
        raise HiggsServeError("--uds: the data-parallel front end listens on --host/--port (its "
                              "replicas get private Unix sockets of their own)")
    devices = plan_devices(args.data_parallel_size, args.devices, args.device,
                           torch.cuda.device_count())
    # the single server's limits and key, checked now and enforced by the front end
    settings = _server_settings(args, args.port or ServerSettings.port, {})
    if args.mps:
        check_mps(devices)  # before the model is read: a missing binary is a flag error
    # the replicas sign the files; a chain c2pa refuses fails here, before any replica starts
    preflight.load_provenance(settings)
    model_dir, deploy = _model_and_deploy(args, args.load_format, generates=True)
    _check_ttfa_budget(args, deploy)
    plan = ClusterPlan(devices, capacity=deploy.stage0.max_num_seqs + args.max_queue,
                       routing=args.routing, mps=args.mps)
    # every single-server flag except where it listens, its key, its voices directory and the
    # playground page (the front end owns those); the device comes from the plan
    passed = {"--max-queue": args.max_queue, "--max-input-chars": args.max_input_chars,
              "--segment-max-chars": args.segment_max_chars, "--max-audio-s": args.max_audio_s,
              "--ws-idle-timeout-s": args.ws_idle_timeout_s,
              "--allowed-ref-audio-domains": args.allowed_ref_audio_domains,
              "--allowed-local-media-path": args.allowed_local_media_path,
              "--send-timeout-s": args.send_timeout_s, "--ttfa-budget-s": args.ttfa_budget_s,
              "--encode-threads": args.encode_threads,
              "--alignment-workers": args.alignment_workers,
              "--alignment-queue-s": args.alignment_queue_s, "--worker-timeout-s": args.worker_timeout_s,
              "--worker-nice": args.worker_nice,
              # the replicas share the host's cores (each its own encoder processes; "auto"
              # leaves each replica's engine process its own cores)
              "--encode-processes": (default_encode_processes(len(devices))
                                     if args.encode_processes is None else args.encode_processes),
              "--worker-cpus": (default_worker_cpus(len(devices)) if args.worker_cpus == "auto"
                                else args.worker_cpus),
              "--load-format": args.load_format, "--dtype": args.dtype,
              "--deploy-config": args.deploy_config, "--stage-overrides": args.stage_overrides,
              "--max-num-seqs": args.max_num_seqs, "--kv-cache-dtype": args.kv_cache_dtype,
              "--watermark": args.watermark, "--c2pa-cert": args.c2pa_cert, "--c2pa-key": args.c2pa_key,
              "--c2pa-tsa-url": args.c2pa_tsa_url}
    serve_args = ["--served-model-name", *args.served_model_name]
    # each replica gets the aliases (checked above, before the model was read) as NAME=VOICE
    serve_args += [x for alias, voice in settings.voice_aliases for x in ("--voice-alias", f"{alias}={voice}")]
    serve_args += [str(x) for flag, value in passed.items() if value not in (None, "")
                   for x in (flag, value)]
    voices_dir = (preflight.check_output_dir(args.voices_dir, "--voices-dir") if args.voices_dir
                  else ServerSettings().voices_dir)
    listener = preflight.bind_listen_socket(args.host, args.port)  # a port in use fails here
    run_cluster(plan, str(model_dir), serve_args, listener=listener, voices_dir=Path(voices_dir),
                sample_rate_hz=load_model_spec(model_dir).codec.sample_rate, settings=settings,
                log_level=args.log_level)
    return 0


# ---------------------------------------------------------------------------- detect
def _cmd_detect(args: argparse.Namespace) -> int:
    """Every file checked first (exists, size, header: a bad one fails before the detector
    loads), then each decoded and scored in turn, holding one file's detection at a time
    (audio/watermark_detect.py): one line per file, its verdict (why, when inconclusive) and the
    detector's score. Messages name the flags (CLI_NAMING), not the endpoint's fields."""
    from higgs_serve.audio.watermark_detect import CLI_NAMING, DETECT_MAX_BYTES, LazyDetector, open_for_detection

    if args.sample_rate is not None and args.format is None:
        raise ConfigError("--sample-rate is the rate of headerless FILEs: give --format too")
    if args.sample_rate is not None and not 8000 <= args.sample_rate <= 192_000:
        raise ConfigError(f"--sample-rate {args.sample_rate}: give a rate from 8000 to 192000 Hz")
    for path in args.files:
        file = preflight.check_input_file(path, "FILE")
        if file.stat().st_size > DETECT_MAX_BYTES:  # refused before a byte is read
            raise ConfigError(f"FILE {path}: {file.stat().st_size} bytes; detection reads files of at most "
                              f"{DETECT_MAX_BYTES // 2**20} MiB")
        with open(file, "rb") as handle:
            open_for_detection(handle, f"FILE {path}", args.format, args.sample_rate, CLI_NAMING).close()
    detector = LazyDetector()
    for path in args.files:
        with open(Path(path).expanduser(), "rb") as handle:
            found = detector.detect_file(handle, f"FILE {path}", args.format, args.sample_rate, CLI_NAMING)
        if args.json:
            print(json.dumps({"file": path, "detected": found.detected, "verdict": found.verdict,
                              "reason": found.reason, "score": round(found.score, 6)}), flush=True)
        else:
            print(f"{path}: {verdict_line(found)} (score {found.score:.3f})", flush=True)
    return 0


def verdict_line(found) -> str:
    """A Finding in words: the verdict, and for an inconclusive one its actual cause."""
    from higgs_serve.audio.watermark_detect import MARKED_IN_PART

    if found.verdict == "marked":
        return "marked"
    if found.verdict == "not_marked":
        return "not marked"
    if found.reason == MARKED_IN_PART:
        return (f"inconclusive: marked in part only, {found.marked_frame_fraction:.0%} of the frames "
                "judged")
    # the network scores anything that is not speech at random (docs/api.md#watermark-and-provenance)
    return "inconclusive: too little speech-like audio to judge; the score means nothing on noise, " \
           "tones, music or silence"


# ---------------------------------------------------------------------------- config show
def _cmd_config_show(args: argparse.Namespace) -> int:
    import torch

    _, deploy = _model_and_deploy(args, None)
    print(json.dumps(deploy.to_dict(cuda_available=torch.cuda.is_available()), indent=2), flush=True)
    return 0


# ---------------------------------------------------------------------------- make-tiny-model
def _cmd_make_tiny_model(args: argparse.Namespace) -> int:
    from higgs_serve.model.tiny import write_tiny_model

    if args.preset == "4b" and not args.config_only:
        raise ConfigError("--preset 4b without --config-only would write about 9 GB of random weights: "
                          "add --config-only and load it with --load-format dummy")
    directory = preflight.check_new_dir(args.dir, "DIR", args.force)
    write_tiny_model(directory, seed=args.seed, preset=args.preset, config_only=args.config_only)
    what = "config.json and tokenizer" if args.config_only else "checkpoint"
    print(f"wrote {args.preset} {what} to {args.dir}")
    return 0


# ---------------------------------------------------------------------------- parser
# Every example runs as written in a directory holding me.wav (tests/unit/test_cli_examples.py
# runs each one, with the port replaced by a free one).
EXAMPLES = f"""examples:
  higgs-serve make-tiny-model ./tiny-model
  higgs-serve synth ./tiny-model --text "Hello from higgs-serve." --output-dir out
  higgs-serve config show ./tiny-model --stage-overrides '{STAGE_OVERRIDES_EXAMPLE}'
  higgs-serve encode-voice ./tiny-model me.wav -o codes.npy
  higgs-serve serve ./tiny-model --port 8000
  higgs-serve detect out/0000.wav
"""


def _subcommand(sub, name: str, help_text: str, func, usage: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_text, description=help_text, formatter_class=HelpFormatter,
                       usage=f"higgs-serve {usage}", parents=[global_options(argparse.SUPPRESS)])
    p.set_defaults(func=func, command_parser=p)
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="higgs-serve", description=__doc__.split("\n\n")[0],
                                     epilog=EXAMPLES, formatter_class=HelpFormatter,
                                     parents=[global_options("INFO")])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = _subcommand(sub, "synth", "synthesize speech offline into WAV + NPZ files", _cmd_synth,
                    "synth MODEL --text TEXT [--text TEXT ...] --output-dir DIR [options]")
    add_synth_flags(p)

    p = _subcommand(sub, "encode-voice", "encode a reference clip into codec codes (.npy, [T, 8] int64)",
                    _cmd_encode_voice, "encode-voice MODEL FILE -o OUTPUT [options]")
    add_encode_voice_flags(p)

    p = _subcommand(sub, "serve", "run the OpenAI-compatible HTTP server", _cmd_serve,
                    "serve MODEL [--host HOST] [--port PORT] [options]")
    add_serve_flags(p)

    p = _subcommand(sub, "detect", "check audio files for the watermark higgs-serve puts in what it generates",
                    _cmd_detect, "detect FILE [FILE ...] [--json]")
    add_detect_flags(p)

    p = sub.add_parser("config", help="deploy config tools", description="deploy config tools",
                       formatter_class=HelpFormatter, parents=[global_options(argparse.SUPPRESS)])
    csub = p.add_subparsers(dest="config_command", required=True, metavar="COMMAND")
    show = _subcommand(csub, "show", "print the fully resolved deploy config as JSON", _cmd_config_show,
                       "config show MODEL [options]")
    add_config_show_flags(show)

    p = _subcommand(sub, "make-tiny-model", "write a small random checkpoint in the real layout",
                    _cmd_make_tiny_model, "make-tiny-model DIR [--seed N] [--preset {tiny,4b}] [--config-only] [--force]")
    add_make_tiny_model_flags(p)
    return parser


def _resolve_model(args: argparse.Namespace) -> None:
    """MODEL and --model are one argument: exactly one of them, or the same value twice."""
    if not hasattr(args, "model_flag"):
        return
    given = {value for value in (args.model, args.model_flag) if value}
    if not given:
        args.command_parser.error("the following arguments are required: MODEL")
    if len(given) > 1:
        args.command_parser.error(f"MODEL {args.model!r} and --model {args.model_flag!r} differ: give one")
    (args.model,) = given


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _resolve_model(args)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(args.log_level)  # basicConfig does nothing on a second main() in one process
    try:
        return args.func(args)
    except BrokenPipeError:  # `higgs-serve config show MODEL | head`: the reader left, nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except (HiggsServeError, ValueError, OSError) as error:  # a user's mistake: its message, no traceback
        logger.debug("the error's traceback", exc_info=True)
        print(f"higgs-serve: error: {error}", file=sys.stderr, flush=True)
        return EXIT_USER_ERROR
    except (MemoryError, RuntimeError) as error:
        if not _out_of_memory(error):
            raise  # a bug: its traceback
        print(f"higgs-serve: error: {OUT_OF_MEMORY} ({_first_line(error)})", file=sys.stderr, flush=True)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        _exit_now(EXIT_INTERRUPTED, "higgs-serve: interrupted")


OUT_OF_MEMORY = ("out of memory loading or running the model: lower what it needs (--max-num-seqs, "
                 "--stage-overrides '{\"0\": {\"max_model_len\": 2048}}', --kv-cache-dtype fp8, --dtype bfloat16) "
                 "or free the device")


def _out_of_memory(error: BaseException) -> bool:
    """torch's CUDA OutOfMemoryError, its CPU allocator's failure (a RuntimeError), MemoryError."""
    text = str(error).lower()
    return (isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError"
            or "not enough memory" in text or "can't allocate memory" in text or "out of memory" in text)


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def _exit_now(code: int, message: str) -> None:
    """Exit without waiting for other threads: a model load cannot be interrupted from outside,
    and its memory (GPU included) goes back with the process."""
    print(message, file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    logging.shutdown()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
