"""--voice-alias on the command line: NAME=VOICE pairs or @FILE, checked before anything loads."""

from __future__ import annotations

import pytest

from higgs_serve.errors import ConfigError
from higgs_serve.preflight import read_voice_aliases
from higgs_serve.server.settings import ServerSettings


def test_pairs_and_files_in_order(tmp_path):
    file = tmp_path / "aliases.txt"
    file.write_text("# OpenAI's names\nalloy = default\n\nnova=narrator  # a registered voice\n")
    assert read_voice_aliases(["echo=default", f"@{file}"]) == (
        ("echo", "default"), ("alloy", "default"), ("nova", "narrator"))
    assert read_voice_aliases(None) == ()


@pytest.mark.parametrize("value, words", [
    ("alloy", "expected NAME=VOICE"), ("=default", "expected NAME=VOICE"),
    ("alloy=", "expected NAME=VOICE"), ("@/no/such/file", "no such file"),
])
def test_malformed_values_name_the_flag(value, words):
    with pytest.raises(ConfigError, match="--voice-alias") as info:
        read_voice_aliases([value])
    assert words in str(info.value)


@pytest.mark.parametrize("pairs, words", [
    ((("default", "narrator"),), "'default' is the zero-shot voice"),
    ((("alloy", "alloy"),), "an alias of itself"),
    ((("alloy", "a"), ("alloy", "b")), "given twice"),
    ((("alloy", "nova"), ("nova", "default")), "not another alias"),
    ((("al loy", "default"),), "not a voice name"),
])
def test_settings_refuse_bad_aliases(pairs, words):
    with pytest.raises(ConfigError, match="--voice-alias") as info:
        ServerSettings(voice_aliases=pairs)
    assert words in str(info.value)
    assert ServerSettings(voice_aliases=(("alloy", "default"),)).voice_alias_map == {"alloy": "default"}


def test_serve_passes_aliases_and_encode_threads_to_the_settings(tiny_model_dir, tmp_path,
                                                                 monkeypatch):
    from higgs_serve import cli

    seen = {}
    monkeypatch.setattr("higgs_serve.server.app.run_server",
                        lambda model, settings, *a, **k: seen.setdefault("settings", settings))
    file = tmp_path / "a.txt"
    file.write_text("nova=narrator\n")
    assert cli.main(["serve", str(tiny_model_dir), "--device", "cpu", "--port", "0",
                     "--voice-alias", "alloy=default", "--voice-alias", f"@{file}",
                     "--encode-threads", "3"]) == 0
    settings = seen["settings"]
    assert settings.voice_aliases == (("alloy", "default"), ("nova", "narrator"))
    assert settings.encode_threads == 3
    assert cli.main(["serve", str(tiny_model_dir), "--device", "cpu", "--port", "0",
                     "--voice-alias", "default=narrator"]) != 0  # a one-line error, no traceback
