"""The flags every `higgs-serve` command shares, and the help format: one place, so the model
argument, the load options and `--log-level` read the same in every command."""

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
                   help="auto: the checkpoint's weights; dummy: random weights built from config.json alone")
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


def port_number(text: str) -> int:
    port = int(text)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port (0 to 65535; 0: any free port)")
    return port
