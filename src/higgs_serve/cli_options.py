"""Every `higgs-serve` command's flags and the help format. The shared ones (the model argument,
the load options, `--log-level`) are written once so they read the same in every command; each
command's own flags follow, one function per command (cli.py wires them to the commands)."""

from __future__ import annotations

import argparse

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# The --stage-overrides example in the help; tests/unit/test_cli_examples.py runs it on the default profile.
STAGE_OVERRIDES_EXAMPLE = '{"0": {"max_model_len": 4096}, "1": {"max_batch_windows": 8}}'


# ---------------------------------------------------------------------------- help format
class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the examples' line breaks, and appends every flag's default that says something
    (a None default is described in the flag's own help)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("%(default)" in text or not action.option_strings or default is None or default is False
                or default is argparse.SUPPRESS or default == ""):
            return text
        return f"{text} (default: %(default)s)"


def global_options(default_level: str) -> argparse.ArgumentParser:
    """--log-level, accepted before the command (default INFO) and after it (SUPPRESS keeps a
    value given before the command from being reset by the command's parser)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default=default_level,
                   help="log verbosity; DEBUG also prints the traceback behind an error"
                        + (" (default: the level given before the command, else INFO)"
                           if default_level == argparse.SUPPRESS else " (default: %(default)s)"))
    return p


def add_model_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", metavar="MODEL",
                   help="model directory or Hugging Face hub id (owner/name)")
    p.add_argument("--model", dest="model_flag", metavar="MODEL", default=None,
                   help="the same as the positional MODEL (the older spelling; give one of the two)")


# ---------------------------------------------------------------------------- shared options
def add_model_options(p: argparse.ArgumentParser, engine: bool = True) -> None:
    """What every model-loading command takes: how to load, where, and the deploy profile.
    engine=False (encode-voice: no engine, no KV cache) leaves out the Stage 0 engine flags,
    which would change nothing there."""
    p.add_argument("--load-format", choices=["auto", "dummy"], default="auto",
                   help="auto: the checkpoint's weights; dummy: random weights built from config.json alone "
                        "(the watermark's network too: benchmarks)")
    p.add_argument("--device", default=None,
                   help="cpu, cuda or cuda:N (default: cuda when available, else cpu)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                   help="talker dtype (default: bfloat16 on CUDA, float32 on CPU)")
    add_deploy_options(p, engine)


def add_deploy_options(p: argparse.ArgumentParser, engine: bool = True) -> None:
    p.add_argument("--deploy-config", default=None,
                   help="a deploy YAML path or the bare name of a shipped profile "
                        "(default: discovered from the model's model_type)")
    p.add_argument("--stage-overrides", default=None,
                   help=f"JSON of per-stage keys over the profile, e.g. '{STAGE_OVERRIDES_EXAMPLE}' "
                        "(default: none)")
    if not engine:
        return
    p.add_argument("--max-num-seqs", type=int, default=None,
                   help="Stage 0 max_num_seqs; also fits the profile's capture sizes and token budget "
                        "(default: the profile's)")
    p.add_argument("--kv-cache-dtype", default=None,
                   help="Stage 0 kv_cache_dtype: auto (the model dtype) or fp8 (alias fp8_e4m3) "
                        "(default: the profile's)")
    p.add_argument("--watermark", choices=["on", "off"], default=None,
                   help="mark every generated signal as AI-generated with an imperceptible watermark "
                        "(`higgs-serve detect` finds it) or leave the audio unmarked "
                        "(default: the profile's `watermark`, on in the shipped profiles)")


def port_number(text: str) -> int:
    port = int(text)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port (0 to 65535; 0: any free port)")
    return port


# ---------------------------------------------------------------------------- each command's flags
def add_synth_flags(p: argparse.ArgumentParser) -> None:
    """synth: the texts, the outputs, sampling, cloning, long-form, and the model options."""
    add_model_argument(p)
    p.add_argument("--text", action="append", required=True, help="text to speak (repeatable: one request each)")
    p.add_argument("--output-dir", required=True, help="where OUT/NNNN.wav and OUT/NNNN.npz go (created if missing)")
    p.add_argument("--temperature", type=float, help="sampling temperature; 0 = greedy (default: the profile's)")
    p.add_argument("--top-p", type=float, help="nucleus sampling mass (default: the profile's)")
    p.add_argument("--top-k", type=int, help="sample among the k most likely codes (default: the profile's)")
    p.add_argument("--seed", type=int, help="sampling seed, the same for every --text (default: a random one per request)")
    p.add_argument("--max-new-tokens", type=int, help="frame cap per request, 25 frames = 1 s (default: the profile's)")
    p.add_argument("--min-new-tokens", type=int, help="frames before the model may stop, for benchmarks (default: 0)")
    p.add_argument("--stream", action="store_true",
                   help="stream chunks to OUT/NNNN.stream.f32 as they arrive and check them against the final audio")
    p.add_argument("--ref-audio", default=None,
                   help="clone this voice (wav/flac/ogg/mp3, 0.5-30 s) for every --text (default: none)")
    p.add_argument("--ref-text", default=None, help="transcript of --ref-audio / --ref-codes (default: none)")
    p.add_argument("--ref-codes", default=None,
                   help="clone from codes [T, 8] saved by encode-voice (.npy) instead of --ref-audio (default: none)")
    add_model_options(p)
    p.add_argument("--segment-max-chars", type=int, default=300,
                   help="a longer --text is split into segments of at most this many characters and "
                        "spoken as one recording (NNNN.wav + NNNN.segments.json)")
    p.add_argument("--max-audio-s", type=float, default=7200.0, help="longest audio of one long-form --text (seconds)")
    p.add_argument("--word-timestamps", action="store_true",
                   help="also write OUT/NNNN.words.json: [{word, start_ms, end_ms}] per word of the text, by "
                        "forced alignment (English; docs/api.md#word-timestamps)")


def add_encode_voice_flags(p: argparse.ArgumentParser) -> None:
    """encode-voice: the clip and the exact output path; no engine, so no engine flags."""
    add_model_argument(p)
    p.add_argument("file", metavar="FILE", help="reference audio (wav/flac/ogg/mp3, 0.5-30 s)")
    p.add_argument("-o", "--output", required=True, help="the .npy file to write, exactly this path")
    add_model_options(p, engine=False)


def add_serve_flags(p: argparse.ArgumentParser) -> None:
    """serve: listening, auth, limits, reference media, replicas."""
    from higgs_serve.server.settings import ServerSettings  # its defaults are the flags' defaults

    add_model_argument(p)
    p.add_argument("--host", default=ServerSettings.host, help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=port_number, default=ServerSettings.port, help="TCP port (0: any free port)")
    p.add_argument("--uds", default=None, metavar="PATH",
                   help="listen on this Unix socket instead of --host/--port (how a data-parallel "
                        "front end reaches its replicas; default: TCP)")
    p.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` on /v1/* (default: open)")
    p.add_argument("--served-model-name", nargs="+", default=[ServerSettings.served_model_name],
                   help="one or more names requests may use; /v1/models lists them all")
    p.add_argument("--max-queue", type=int, default=ServerSettings.max_queue,
                   help="requests allowed to wait beyond the running ones; past it, 429")
    p.add_argument("--max-input-chars", type=int, default=ServerSettings.max_input_chars,
                   help="longest input (characters); inputs past --segment-max-chars are split "
                        "and spoken as one recording; longer is a 413")
    p.add_argument("--segment-max-chars", type=int, default=ServerSettings.segment_max_chars,
                   help="long-form: sentences are grouped into engine requests of at most this many characters")
    p.add_argument("--max-audio-s", type=float, default=ServerSettings.max_audio_s,
                   help="longest audio of one long-form response or WebSocket session (seconds)")
    p.add_argument("--ws-idle-timeout-s", type=float, default=ServerSettings.ws_idle_timeout_s,
                   help="close a WebSocket session idle this long with nothing left to speak")
    p.add_argument("--voices-dir", default=None,
                   help=f"where registered voices persist (default: {ServerSettings().voices_dir})")
    p.add_argument("--allowed-ref-audio-domains", default="",
                   help="comma-separated hosts whose http(s) URLs may be given as ref_audio (default: none)")
    p.add_argument("--allowed-local-media-path", default=None, metavar="DIR",
                   help="directory whose files may be named as reference audio, by path or file:// URL (default: none)")
    p.add_argument("--send-timeout-s", type=float, default=ServerSettings.send_timeout_s,
                   help="a client that reads nothing for this long loses its response and slot")
    p.add_argument("--ttfa-budget-s", type=float, default=None,
                   help="a streamed request whose first audio would come later than this (the server "
                        "speaking all the streams it can in real time) gets 503 with Retry-After at once "
                        f"(default {ServerSettings.ttfa_budget_s:g}; the deadline policy's: refused with "
                        "stages[0].deadlines.enabled false)")
    p.add_argument("--detect-wait-s", type=float, default=ServerSettings.detect_wait_s,
                   help="a watermark detection that finds every detection slot busy waits this long at "
                        "most for one; past it, or when the queue plainly would not clear in time, 429 "
                        "with Retry-After (0: refuse at once)")
    p.add_argument("--c2pa-cert", default=None, metavar="PEM",
                   help="sign wav, mp3 and flac files with a C2PA manifest saying a model made the audio: "
                        "this certificate chain (PEM, signing certificate first) with --c2pa-key "
                        "(default: files unsigned)")
    p.add_argument("--c2pa-key", default=None, metavar="PEM",
                   help="the private key (PEM, unencrypted) of --c2pa-cert (default: none)")
    p.add_argument("--c2pa-tsa-url", default=None, metavar="URL",
                   help="an RFC 3161 timestamp authority that countersigns each manifest (default: none)")
    p.add_argument("--encode-processes", type=int, default=None, metavar="N",
                   help="encoder processes for mp3, opus, aac, flac and speed != 1: each response is "
                        "encoded in one of them, away from the server's GIL (pcm, wav and G.711 stay in "
                        "the server); 0 encodes on --encode-threads in the server process instead "
                        "(default: one per host core less 2 for the server, at most 32: "
                        f"{ServerSettings.encode_processes} here; with replicas, the cores left are "
                        "shared among them)")
    p.add_argument("--encode-threads", type=int, default=ServerSettings.encode_threads,
                   help="threads in the server process that sign C2PA files and, with "
                        "--encode-processes 0, encode responses (PyAV releases the GIL for part of "
                        "the work); one a core lets encoding use the whole host")
    p.add_argument("--alignment-workers", type=int, default=ServerSettings.alignment_workers,
                   help="aligner processes for word_timestamps requests, started at the first such "
                        "request; the default is a quarter of the cores, 1 to 4; 0 refuses word_timestamps")
    p.add_argument("--alignment-queue-s", type=float, default=ServerSettings.alignment_queue_s,
                   help="seconds of audio that may wait for one aligner process; past it a "
                        "sentence's words are skipped with an aligner_overloaded words error "
                        "(its audio is unaffected); 0.1 MB a second")
    p.add_argument("--worker-timeout-s", type=float, default=ServerSettings.worker_timeout_s,
                   help="an encoder or aligner process that owes an answer and gives none for "
                        "this long (plus 0.1 s, aligners 0.2 s, per second of audio in its work) "
                        "is killed and replaced; its responses end with an error (encoders) or "
                        "its sentence is retried once (aligners)")
    p.add_argument("--worker-cpus", default=ServerSettings.worker_cpus, metavar="CPUS",
                   help="the cores of the encoder and aligner processes: 'auto' (the server's "
                        "cores less 2 left to the engine's process, when at least 2 remain; "
                        "otherwise all), 'all', or a list such as 2-7,12")
    p.add_argument("--worker-nice", type=int, default=ServerSettings.worker_nice,
                   help="niceness added to the encoder and aligner processes (0-19), so side "
                        "work never slows an engine step")
    p.add_argument("--voice-alias", action="append", default=None, metavar="NAME=VOICE",
                   help="let requests name VOICE (a registered voice or 'default') as NAME, e.g. "
                        "alloy=default for OpenAI-only clients; repeatable, or @FILE of NAME=VOICE "
                        "lines (default: no aliases; OpenAI's stock names are a 400)")
    p.add_argument("--no-playground", action="store_true",
                   help="do not serve the playground page at / (a browser page to hear voices, "
                        "formats and streams; with --api-key it asks for the key); / is then a 404")
    p.add_argument("--data-parallel-size", type=int, default=None,
                   help="run N engine replicas (one per GPU, or N CPU replicas with --device cpu) "
                        "behind one front end on --host/--port (default: one server, no front end)")
    p.add_argument("--devices", default=None,
                   help="GPU indices of the replicas, e.g. 0,1,2,3; a repeated index shares a GPU "
                        "(default: 0..N-1 with --data-parallel-size N)")
    p.add_argument("--mps", action="store_true",
                   help="run the replicas that share a GPU (a GPU listed twice in --devices) under NVIDIA "
                        "MPS, so their kernels run at once instead of in turns: the front end starts a "
                        "private MPS control daemon per shared GPU and stops it at exit "
                        "(needs nvidia-cuda-mps-control on PATH; default: off, time-sliced)")
    p.add_argument("--routing", choices=["affinity", "least-loaded"], default="affinity",
                   help="with several replicas: route a voice to the replica that has it cached "
                        "(affinity) or every request to the less loaded of two (least-loaded)")
    add_model_options(p)


def add_config_show_flags(show: argparse.ArgumentParser) -> None:
    """config show: the device to resolve the profile for, and the deploy options."""
    add_model_argument(show)
    show.add_argument("--device", default=None,
                      help="cpu, cuda or cuda:N: resolve the profile for this device (default: cuda when available)")
    add_deploy_options(show)


def add_detect_flags(p: argparse.ArgumentParser) -> None:
    """detect: the files to check and how headerless ones are read; no model, no device."""
    p.add_argument("files", metavar="FILE", nargs="+",
                   help="audio to check: wav, flac, ogg/opus, mp3, aac, m4a/mp4, webm (or headerless "
                        "samples with --format)")
    p.add_argument("--format", choices=["pcm", "ulaw", "alaw"], default=None,
                   help="the FILEs are headerless samples in this encoding (pcm: 16-bit little-endian) "
                        "(default: files with a header, their format found from their bytes)")
    p.add_argument("--sample-rate", type=int, default=None,
                   help="the rate of headerless FILEs (default: 24000 for pcm, 8000 for ulaw and alaw)")
    p.add_argument("--json", action="store_true",
                   help="one JSON object a line: {\"file\", \"detected\", \"verdict\", \"reason\", \"score\"} "
                        "(reason: why a verdict is inconclusive, else null)")


def add_make_tiny_model_flags(p: argparse.ArgumentParser) -> None:
    """make-tiny-model: where, which seed and geometry, weights or config only."""
    p.add_argument("dir", metavar="DIR", help="directory to write (created if missing)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    p.add_argument("--preset", choices=["tiny", "4b"], default="tiny",
                   help="tiny: milliseconds a step on CPU; 4b: the real geometry (needs --config-only)")
    p.add_argument("--config-only", action="store_true",
                   help="write config.json and tokenizer only (load it with --load-format dummy)")
    p.add_argument("--force", action="store_true",
                   help="write into DIR even if it is not empty (its model files are overwritten)")
