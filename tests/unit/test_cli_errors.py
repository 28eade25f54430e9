"""Issue 27 items 2 and 4: every user error a flag can make is found before any model loads, and
ends in one `higgs-serve: error: ...` line naming the problem, exit status 2, no traceback.

"Before loading" is held literally: the model loaders are replaced by a function that fails the
test, so a check that ran only after the load would show up as that failure, not as a pass.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from higgs_serve import cli, preflight
from higgs_serve.errors import ConfigError


@pytest.fixture
def no_load(monkeypatch):
    """Any attempt to load a model fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the command line was checked")

    import higgs_serve.engine.async_engine as async_engine
    import higgs_serve.engine.builder as builder

    monkeypatch.setattr(builder, "load_model", refuse)
    monkeypatch.setattr(async_engine, "load_model", refuse)


def _error(capsys, *argv: str) -> str:
    code = cli.main(["--log-level", "WARNING", *argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and err.startswith("higgs-serve: error: "), err
    assert len(err.strip().splitlines()) == 1, err  # one line
    return err


def _synth(tiny_model_dir, out, *extra) -> list[str]:
    return ["synth", str(tiny_model_dir), "--text", "hi", "--output-dir", str(out), "--device", "cpu", *extra]


# ------------------------------------------------------------------------------ item 2: outputs and inputs
def test_output_dir_that_is_a_file(no_load, capsys, tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    out.write_text("not a directory")
    assert f"--output-dir {out}: exists and is not a directory" in _error(capsys, *_synth(tiny_model_dir, out))


def test_output_file_in_the_way_is_a_directory(no_load, capsys, tiny_model_dir, tmp_path):
    (tmp_path / "out" / "0000.wav").mkdir(parents=True)
    err = _error(capsys, *_synth(tiny_model_dir, tmp_path / "out"))
    assert "0000.wav: is a directory" in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere: no unwritable directory to test with")
def test_unwritable_output_dir(no_load, capsys, tiny_model_dir, tmp_path):
    out = tmp_path / "locked"
    out.mkdir(mode=0o500)
    assert "not writable" in _error(capsys, *_synth(tiny_model_dir, out))


@pytest.mark.parametrize("text", ["", "   "])
def test_empty_text(no_load, capsys, tiny_model_dir, tmp_path, text):
    err = _error(capsys, "synth", str(tiny_model_dir), "--text", "fine", "--text", text,
                 "--output-dir", str(tmp_path / "out"))
    assert "--text number 2: text must not be empty" in err


def test_missing_reference_file(no_load, capsys, tiny_model_dir, tmp_path):
    missing = tmp_path / "nope.wav"
    err = _error(capsys, *_synth(tiny_model_dir, tmp_path / "out", "--ref-audio", str(missing)))
    assert f"--ref-audio {missing}: no such file" in err


def test_reference_that_is_not_audio(no_load, capsys, tiny_model_dir, tmp_path):
    bad = tmp_path / "notes.wav"
    bad.write_text("these are not samples")
    assert f"--ref-audio {bad}" in _error(capsys, *_synth(tiny_model_dir, tmp_path / "out", "--ref-audio", str(bad)))


def test_reference_too_short(no_load, capsys, tiny_model_dir, tmp_path):
    short = tmp_path / "short.wav"
    sf.write(short, np.zeros(2400, np.float32), 24000)  # 0.1 s
    err = _error(capsys, *_synth(tiny_model_dir, tmp_path / "out", "--ref-audio", str(short)))
    assert "0.10 s long" in err and "0.5 to 30 s" in err


def test_ref_text_needs_ref_audio(no_load, capsys, tiny_model_dir, tmp_path):
    err = _error(capsys, *_synth(tiny_model_dir, tmp_path / "out", "--ref-text", "words"))
    assert "--ref-text is the transcript of --ref-audio" in err


def test_encode_voice_checks_file_and_output_first(no_load, capsys, tiny_model_dir, tmp_path, clip):
    missing = tmp_path / "none.flac"
    assert f"FILE {missing}: no such file" in _error(
        capsys, "encode-voice", str(tiny_model_dir), str(missing), "-o", str(tmp_path / "c.npy"))
    assert f"--output {tmp_path}: is a directory" in _error(
        capsys, "encode-voice", str(tiny_model_dir), str(clip), "-o", str(tmp_path))
    nowhere = tmp_path / "no" / "such" / "dir" / "c.npy"
    assert "does not exist" in _error(capsys, "encode-voice", str(tiny_model_dir), str(clip), "-o", str(nowhere))


def test_bad_sampling_value_is_found_before_loading(no_load, capsys, tiny_model_dir, tmp_path):
    assert "temperature" in _error(capsys, *_synth(tiny_model_dir, tmp_path / "out", "--temperature", "-1"))


def test_bad_sampling_value_is_the_first_thing_said(tiny_model_dir, tmp_path):
    """Issue 50: at the default log level, the error comes before any log line (it came after
    the graph mode's)."""
    done = subprocess.run([sys.executable, "-m", "higgs_serve.cli", *_synth(tiny_model_dir, tmp_path / "out",
                                                                           "--temperature", "9")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.splitlines() == ["higgs-serve: error: temperature: 9.0 is outside [0, 2] (0 = greedy)"]


@pytest.mark.parametrize("flag, value, words", [("--max-input-chars", "0", "--max-input-chars must be positive"),
                                                ("--max-queue", "-1", "--max-queue must be >= 0, got -1"),
                                                ("--ttfa-budget-s", "0", "--ttfa-budget-s must be positive"),
                                                ("--detect-wait-s", "-1", "--detect-wait-s must be >= 0, got -1")])
def test_serve_settings_are_checked_before_loading(no_load, capsys, tiny_model_dir, flag, value, words):
    """Each refusal names the flag the user gave (issue 50: not the setting's field name)."""
    err = _error(capsys, "serve", str(tiny_model_dir), "--port", "0", "--device", "cpu", flag, value)
    assert words in err and "server setting" not in err


def test_voices_dir_that_is_a_file(no_load, capsys, tiny_model_dir, tmp_path):
    file = tmp_path / "voices"
    file.write_text("x")
    err = _error(capsys, "serve", str(tiny_model_dir), "--port", "0", "--device", "cpu", "--voices-dir", str(file))
    assert f"--voices-dir {file}: exists and is not a directory" in err


# ------------------------------------------------------------------------------ item 4: misleading errors
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given where CUDA is absent")
@pytest.mark.parametrize("command", ["synth", "config"])
def test_device_cuda_without_cuda_names_the_flag(no_load, capsys, tiny_model_dir, tmp_path, command):
    argv = (["synth", str(tiny_model_dir), "--text", "hi", "--output-dir", str(tmp_path)] if command == "synth"
            else ["config", "show", str(tiny_model_dir)])
    err = _error(capsys, *argv, "--device", "cuda")
    assert "--device cuda: CUDA is not available on this machine" in err and "--device cpu" in err
    assert ".yaml" not in err  # not blamed on a profile the user never named


@pytest.mark.parametrize("device", ["gpu", "cuda0", "cuda:x", "CPU"])
def test_invalid_device_names_the_allowed_forms(no_load, capsys, tiny_model_dir, device):
    err = _error(capsys, "config", "show", str(tiny_model_dir), "--device", device)
    assert f"--device {device!r} is not a device: use cpu, cuda or cuda:N" in err


def test_config_only_dir_without_dummy_gives_the_hint(no_load, capsys, tmp_path):
    assert cli.main(["--log-level", "WARNING", "make-tiny-model", str(tmp_path / "m"), "--config-only"]) == 0
    capsys.readouterr()
    err = _error(capsys, "synth", str(tmp_path / "m"), "--text", "hi", "--output-dir", str(tmp_path / "o"),
                 "--device", "cpu")
    assert "has a config.json but no weights" in err and "--load-format dummy" in err


def test_missing_model_dir(no_load, capsys, tmp_path):
    missing = tmp_path / "no-such-model"
    assert str(missing) in _error(capsys, *_synth(missing, tmp_path / "out"))


def test_hub_error_suggests_the_installed_cli(tmp_path):
    """Offline, a hub id not in the cache: the message names `hf download` (the CLI the installed
    huggingface_hub ships; `huggingface-cli` is gone)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    proc = subprocess.run([sys.executable, "-m", "higgs_serve.cli", "config", "show", "bosonai/higgs-audio-v3-tts-4b"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "`hf download bosonai/higgs-audio-v3-tts-4b --local-dir DIR`" in proc.stderr
    assert "huggingface-cli" not in proc.stderr
    hf = os.path.join(os.path.dirname(sys.executable), "hf")
    assert os.path.exists(hf), "the message names a CLI this environment does not have"


@pytest.mark.parametrize("where", ["before", "after"])
def test_bad_log_level_is_a_usage_error(capsys, tiny_model_dir, where):
    argv = ["config", "show", str(tiny_model_dir)]
    argv = ["--log-level", "foo", *argv] if where == "before" else [*argv, "--log-level", "foo"]
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "invalid choice: 'FOO'" in err and "Traceback" not in err


def test_config_show_into_a_closed_pipe_is_quiet(tiny_model_dir):
    """`higgs-serve config show MODEL | head -1`: the reader is gone; no BrokenPipeError traceback.
    The pipe's read end is closed before the command starts, so every write fails, as it does
    once `head` has read its line and exited."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "higgs_serve.cli", "config", "show", str(tiny_model_dir),
                               "--device", "cpu"], stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert proc.returncode == 141, proc.stderr  # 128 + SIGPIPE, as `cat` reports it
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr


def test_make_tiny_model_4b_needs_config_only(capsys, tmp_path):
    err = _error(capsys, "make-tiny-model", str(tmp_path / "big"), "--preset", "4b")
    assert "--config-only" in err and "9 GB" in err
    assert not (tmp_path / "big").exists()  # refused before writing anything


def test_make_tiny_model_keeps_a_non_empty_directory_unless_forced(capsys, tmp_path):
    """Issue 40 item 11: make-tiny-model wrote over an existing directory without a word."""
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    err = _error(capsys, "make-tiny-model", str(target))
    assert f"DIR {target} is not empty" in err and "--force" in err
    assert sorted(p.name for p in target.iterdir()) == ["notes.txt"]  # nothing written
    assert cli.main(["--log-level", "WARNING", "make-tiny-model", str(target), "--config-only",
                     "--force"]) == 0
    assert (target / "config.json").exists() and (target / "notes.txt").read_text() == "keep me"
    assert cli.main(["--log-level", "WARNING", "make-tiny-model", str(tmp_path / "empty"),
                     "--config-only"]) == 0  # a new (or empty) directory needs no flag


def test_out_of_memory_is_one_line_with_what_to_lower(capsys, tmp_path):
    """A real allocation failure: a config whose text embedding needs more bytes than a 64-bit
    process can address (so no overcommit setting lets it through), built with --load-format dummy."""
    assert cli.main(["--log-level", "WARNING", "make-tiny-model", str(tmp_path / "m"), "--config-only"]) == 0
    config_path = tmp_path / "m" / "config.json"
    config = json.loads(config_path.read_text())
    config["text_config"].update(num_hidden_layers=1, vocab_size=2**42, hidden_size=1024, head_dim=256)
    config_path.write_text(json.dumps(config))
    capsys.readouterr()
    err = _error(capsys, "synth", str(tmp_path / "m"), "--load-format", "dummy", "--device", "cpu", "--text", "hi",
                 "--output-dir", str(tmp_path / "out"))
    assert "out of memory loading or running the model: lower what it needs (--max-num-seqs" in err
    assert "allocate" in err  # the allocator's own words, first line only


# ------------------------------------------------------------------------------ the README quotes these
def _troubleshooting_lines() -> list[str]:
    page = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    section = page.split("## Troubleshooting", 1)[1].split("\n## ", 1)[0]
    return [line.strip().removesuffix("`.").strip("`") for line in section.splitlines() if line.strip().startswith("higgs-serve: error: ")
            or line.strip().startswith("`higgs-serve: error: model directory")]


def test_readme_troubleshooting_quotes_the_real_messages(capsys, tmp_path):
    lines = _troubleshooting_lines()
    assert len(lines) == 5, lines
    # port in use: the same words for any port
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError) as exc:
            preflight.bind_listen_socket("127.0.0.1", port)
    assert f"higgs-serve: error: {exc.value}".replace(str(port), "8000") in lines
    # config-only directory without --load-format dummy
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError) as exc:
        preflight.check_model_dir(tmp_path, "auto")
    assert f"higgs-serve: error: {exc.value}".replace(str(tmp_path), "DIR") in lines
    # out of memory: everything before the allocator's own words
    assert f"higgs-serve: error: {cli.OUT_OF_MEMORY} (<the allocator's message>)" in lines
    # the hub message is the one test_hub_error_suggests_the_installed_cli gets from a real offline run
    assert any("`hf download bosonai/higgs-audio-v3-tts-4b --local-dir DIR`" in line for line in lines)
    # no GPU: exact on a machine like the one the README quotes (a CPU build of torch)
    if not torch.cuda.is_available() and torch.version.cuda is None:
        with pytest.raises(ConfigError) as exc:
            preflight.check_device("cuda")
        assert f"higgs-serve: error: {exc.value}".replace(torch.__version__, "2.13.0+cpu") in lines


@pytest.mark.parametrize("extra", [[], ["--data-parallel-size", "1"]])
def test_a_ttfa_budget_with_the_deadline_policy_off_is_refused(no_load, capsys, tiny_model_dir, extra):
    """--ttfa-budget-s is applied by the deadline policy: with the policy off it would be accepted
    and do nothing, so it is refused, naming both."""
    off = json.dumps({"0": {"deadlines": {"enabled": False}}})
    err = _error(capsys, "serve", str(tiny_model_dir), "--port", "0", "--device", "cpu", *extra,
                 "--stage-overrides", off, "--ttfa-budget-s", "2")
    assert "--ttfa-budget-s" in err and "deadlines.enabled" in err
