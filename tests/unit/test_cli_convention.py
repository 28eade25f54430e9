"""Issue 27 item 8: one CLI convention. The model is the first positional argument of every
model-loading command (`--model` is the same argument), global flags go before or after the
command, every flag has help with its default, and outputs land exactly where the user said."""

from __future__ import annotations

import argparse
import re

import numpy as np
import pytest

from higgs_serve import cli

MODEL_COMMANDS = (["synth"], ["encode-voice"], ["serve"], ["config", "show"])


def _subparsers(parser: argparse.ArgumentParser, prefix=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name), sub
                yield from _subparsers(sub, (*prefix, name))


def _parser_for(path):
    return dict(_subparsers(cli.build_parser()))[tuple(path)]


def test_every_flag_has_help_and_shows_its_default():
    parser = cli.build_parser()
    for path, sub in [((), parser), *_subparsers(parser)]:
        help_text = sub.format_help()
        for action in sub._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            assert action.help, f"{' '.join(path)} {action.dest}: no help"
            if not action.option_strings or action.default in (None, False, argparse.SUPPRESS, ""):
                continue
            # a real default is printed by the help formatter
            assert f"(default: {action.default})" in " ".join(help_text.split()), (path, action.dest)
        for action in sub._actions:  # a None default says in words what happens
            if (action.option_strings and action.default is None and not action.required
                    and action.dest != "model_flag"):
                assert "default" in action.help, f"{' '.join(path)} {action.option_strings[0]}: default not described"


@pytest.mark.parametrize("path", MODEL_COMMANDS, ids=" ".join)
def test_model_is_positional_everywhere_and_model_flag_is_the_same(path):
    sub = _parser_for(path)
    positionals = [a for a in sub._actions if not a.option_strings]
    assert positionals[0].dest == "model" and positionals[0].metavar == "MODEL"
    assert sub.format_usage().startswith(f"usage: higgs-serve {' '.join(path)} MODEL")
    extra = {"synth": ["--text", "x", "--output-dir", "o"], "encode-voice": ["f.wav", "-o", "c.npy"]}.get(path[0], [])
    for argv in ([*path, "DIR", *extra], [*path, *extra, "--model", "DIR"], [*path, "DIR", *extra, "--model", "DIR"]):
        args = cli.build_parser().parse_args(argv)
        cli._resolve_model(args)
        assert args.model == "DIR"
        if path[0] == "encode-voice":
            assert args.file == "f.wav"


def test_model_given_twice_differently_is_refused(capsys):
    args = cli.build_parser().parse_args(["serve", "a", "--model", "b"])
    with pytest.raises(SystemExit) as exc:
        cli._resolve_model(args)
    assert exc.value.code == 2 and "MODEL 'a' and --model 'b' differ" in capsys.readouterr().err


def test_missing_model_is_a_usage_error(capsys):
    args = cli.build_parser().parse_args(["config", "show"])
    with pytest.raises(SystemExit):
        cli._resolve_model(args)
    assert "the following arguments are required: MODEL" in capsys.readouterr().err


def test_log_level_before_or_after_the_command():
    parser = cli.build_parser()
    assert parser.parse_args(["--log-level", "debug", "serve", "m"]).log_level == "DEBUG"
    assert parser.parse_args(["serve", "m", "--log-level", "warning"]).log_level == "WARNING"
    assert parser.parse_args(["config", "show", "m", "--log-level", "error"]).log_level == "ERROR"
    assert parser.parse_args(["serve", "m"]).log_level == "INFO"


def test_docstring_and_help_list_only_real_commands():
    commands = {name for (name, *rest), _ in _subparsers(cli.build_parser()) if not rest}
    assert commands == {"synth", "encode-voice", "serve", "detect", "config", "make-tiny-model"}
    listed = set(re.findall(r"[a-z][a-z-]+", cli.__doc__.splitlines()[0].split(":", 1)[1]))
    assert "bench" not in listed and {"synth", "serve", "encode-voice", "detect", "make-tiny-model"} <= listed


def test_encode_voice_takes_the_shared_load_options():
    flags = {s for a in _parser_for(["encode-voice"])._actions for s in a.option_strings}
    assert {"--load-format", "--device", "--dtype", "--deploy-config", "--stage-overrides"} <= flags
    assert not {"--max-num-seqs", "--kv-cache-dtype"} & flags  # no engine here: they would change nothing


def test_encode_voice_writes_exactly_the_path_given(tiny_model_dir, tmp_path, clip, capsys, caplog):
    out = tmp_path / "mycodes"
    caplog.set_level("INFO")
    assert cli.main(["encode-voice", str(tiny_model_dir), str(clip), "-o", str(out), "--device", "cpu",
                     "--dtype", "bfloat16", "--log-level", "INFO"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["me.wav", "mycodes"]  # no mycodes.npy
    assert np.load(out).shape == (25, 8)
    assert f"wrote {out}: codes [25, 8] int64" in capsys.readouterr().out
    assert "torch.bfloat16" in caplog.text  # --dtype took effect: the model loaded in bfloat16


def test_encode_voice_reads_the_deploy_config(tiny_model_dir, tmp_path, clip, capsys):
    code = cli.main(["--log-level", "WARNING", "encode-voice", str(tiny_model_dir), str(clip), "-o", str(tmp_path / "c"),
                     "--deploy-config", "no_such_profile"])
    assert code == 2 and "no_such_profile" in capsys.readouterr().err


def test_synth_prints_files_and_per_request_timing(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["--log-level", "WARNING", "synth", str(tiny_model_dir), "--text", "Hello there.",
                     "--text", "The cat sat on the mat.", "--output-dir", str(out), "--device", "cpu",
                     "--seed", "1", "--max-new-tokens", "10", "--min-new-tokens", "10"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3
    timings = []
    for i, line in enumerate(lines[:2]):
        m = re.fullmatch(rf"{i:04d}: 10 frames, 0\.40 s audio, finish=length, first audio ([\d.]+) s, "
                         rf"done ([\d.]+) s \(RTF [\d.]+\) -> (\S+), (\S+)", line)
        assert m, line
        assert m.group(3) == str(out / f"{i:04d}.wav") and m.group(4) == str(out / f"{i:04d}.npz")
        assert float(m.group(1)) <= float(m.group(2))
        timings.append(m.group(2))
    assert re.fullmatch(r"2 request\(s\): 0\.80 s of audio in [\d.]+ s \(RTF [\d.]+\)", lines[2]), lines[2]
