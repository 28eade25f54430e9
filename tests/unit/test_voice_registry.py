import io
import logging
import os
import shutil
import threading

import numpy as np
import pytest
import soundfile as sf

from higgs_serve.errors import ConflictError, InvalidRequestError
from higgs_serve.voices.registry import (
    MAX_UPLOAD_BYTES,
    VoiceRegistry,
    check_voice_name,
    normalise_reference,
)


def _wav_bytes(seconds: float = 1.0, rate: int = 24000, channels: int = 1) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    audio = (0.4 * np.sin(2 * np.pi * 180 * t)).astype(np.float32)
    if channels > 1:
        audio = np.stack([audio] * channels, axis=1)
    buffer = io.BytesIO()
    sf.write(buffer, audio, rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def test_add_list_get_and_survive_a_restart(tmp_path):
    registry = VoiceRegistry(tmp_path)
    voice = registry.add("alice", _wav_bytes(1.0), ref_text="Hello there.")
    assert (voice.name, voice.ref_text, voice.duration_s, voice.sample_rate_hz) == \
        ("alice", "Hello there.", 1.0, 24000)
    registry.add("bob_2", _wav_bytes(0.5, rate=16000, channels=2))
    reopened = VoiceRegistry(tmp_path)  # a restart: everything comes back from disk
    assert [v.name for v in reopened.list()] == ["alice", "bob_2"]
    assert reopened.get("alice") == voice
    bob = reopened.load_audio("bob_2")
    assert bob.dtype == np.float32 and bob.ndim == 1 and abs(bob.shape[0] - 12000) <= 1


def test_codes_cache_and_delete(tmp_path):
    registry = VoiceRegistry(tmp_path)
    registry.add("carol", _wav_bytes())
    assert registry.cached_codes("carol") is None
    codes = np.arange(40, dtype=np.int64).reshape(5, 8)
    registry.store_codes("carol", codes)
    assert np.array_equal(VoiceRegistry(tmp_path).cached_codes("carol"), codes)
    assert registry.delete("carol") is True
    assert registry.delete("carol") is False
    assert registry.get("carol") is None and not (tmp_path / "carol").exists()
    assert VoiceRegistry(tmp_path).list() == []


@pytest.mark.parametrize("name, match", [
    ("", "voice name must be"), ("../evil", "voice name must be"), (".hidden", "voice name"),
    ("a" * 65, "voice name must be"), ("default", "reserved"),
])
def test_bad_names_are_refused(tmp_path, name, match):
    with pytest.raises(InvalidRequestError, match=match) as info:
        VoiceRegistry(tmp_path).add(name, _wav_bytes())
    assert info.value.param == "name"


def test_duplicates_bad_audio_and_durations_are_refused(tmp_path):
    registry = VoiceRegistry(tmp_path)
    registry.add("dave", _wav_bytes())
    with pytest.raises(InvalidRequestError, match="already exists"):
        registry.add("dave", _wav_bytes())
    with pytest.raises(InvalidRequestError, match="not a supported audio file") as info:
        registry.add("eve", b"not audio at all")
    assert info.value.param == "audio_sample"
    with pytest.raises(InvalidRequestError, match="must last"):
        registry.add("eve", _wav_bytes(0.05))
    with pytest.raises(InvalidRequestError, match="limit"):
        registry.add("eve", b"\0" * (MAX_UPLOAD_BYTES + 1))
    assert [v.name for v in registry.list()] == ["dave"]


def test_interrupted_upload_is_cleaned_on_start(tmp_path):
    staging = tmp_path / ".staging-abc"
    staging.mkdir()
    (staging / "voice.json").write_text("{}")
    assert VoiceRegistry(tmp_path).list() == []
    assert not staging.exists()


def test_normalise_reference_resamples_to_the_model_rate():
    audio = normalise_reference(_wav_bytes(1.0, rate=48000), 24000, param="ref_audio")
    assert audio.shape[0] == 24000 and audio.dtype == np.float32


# ----------------------------------------------------------------------------- races, crashes
def test_codes_of_a_replaced_voice_are_not_stored_into_its_successor(tmp_path):
    """Interleaving: use looks up v1 and encodes it; meanwhile v1 is deleted and a new voice
    registered under the same name; the use then stores v1's codes: dropped, not persisted."""
    registry = VoiceRegistry(tmp_path)
    first = registry.add("eve", _wav_bytes(1.0))
    audio = registry.load_audio(first)
    assert registry.delete("eve")
    second = registry.add("eve", _wav_bytes(2.0))
    old_codes = np.full((5, 8), 7, dtype=np.int64)  # "encoded" from `audio` of the first voice
    assert audio.shape[0] == 24000
    assert registry.store_codes(first, old_codes) is False
    assert registry.cached_codes(second) is None
    assert not (tmp_path / "eve" / "codes.npy").exists()
    assert VoiceRegistry(tmp_path).cached_codes("eve") is None  # nor after a restart
    assert registry.store_codes(second, old_codes[:2]) is True


def test_a_voice_deleted_while_in_use_is_a_conflict(tmp_path):
    registry = VoiceRegistry(tmp_path)
    voice = registry.add("finn", _wav_bytes())
    registry.delete("finn")
    for use in (registry.load_audio, registry.cached_codes):
        with pytest.raises(ConflictError) as caught:
            use(voice)
        assert caught.value.param == "voice"


def test_broken_voice_folders_are_skipped_at_start(tmp_path, caplog):
    registry = VoiceRegistry(tmp_path)
    registry.add("good", _wav_bytes())
    for name, meta in [("empty", ""), ("garbage", "{not json"), ("wrong_keys", '{"a": 1}'),
                       ("no_audio", None), ("renamed", None)]:
        (tmp_path / name).mkdir()
        if meta is not None:
            (tmp_path / name / "voice.json").write_text(meta)
    good_meta = (tmp_path / "good" / "voice.json").read_text()
    (tmp_path / "no_audio" / "voice.json").write_text(good_meta.replace('"good"', '"no_audio"'))
    (tmp_path / "renamed" / "voice.json").write_text(good_meta)  # names another folder
    (tmp_path / "renamed" / "audio.wav").write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="higgs_serve.voices.registry"):
        reopened = VoiceRegistry(tmp_path)
    assert [voice.name for voice in reopened.list()] == ["good"]
    assert caplog.text.count("skipping voice folder") == 5


def test_delete_renames_aside_before_removing(tmp_path, monkeypatch):
    """A crash during the removal leaves no half voice behind: the folder was renamed first."""
    registry = VoiceRegistry(tmp_path)
    registry.add("gina", _wav_bytes())
    monkeypatch.setattr(shutil, "rmtree", lambda *args, **kwargs: None)  # "crash" before removal
    assert registry.delete("gina")
    assert not (tmp_path / "gina").exists()
    assert [path.name[:9] for path in tmp_path.iterdir()] == [".deleted-"]
    monkeypatch.undo()
    assert VoiceRegistry(tmp_path).list() == [] and list(tmp_path.iterdir()) == []


def test_writes_are_fsynced_before_the_rename(tmp_path, monkeypatch):
    events = []
    real_fsync, real_rename = os.fsync, os.rename
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "rename", lambda a, b: (events.append("rename"), real_rename(a, b))[1])
    VoiceRegistry(tmp_path).add("hank", _wav_bytes())
    # audio.wav, voice.json and the staging folder, then the rename, then the parent folder
    assert events == ["fsync", "fsync", "fsync", "rename", "fsync"]


def test_concurrent_registrations_of_one_name_give_one_voice_and_conflicts(tmp_path):
    registry = VoiceRegistry(tmp_path)
    barrier = threading.Barrier(6)
    outcomes = []

    def register(i: int) -> None:
        barrier.wait()
        try:
            registry.add("ivy", _wav_bytes(1.0 + i / 10))
            outcomes.append("ok")
        except ConflictError:
            outcomes.append("conflict")

    threads = [threading.Thread(target=register, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["conflict"] * 5 + ["ok"]
    assert [path.name for path in tmp_path.iterdir()] == ["ivy"]  # no staging leftovers


@pytest.mark.parametrize("name", ["evil\n", "evil\r\n", "a\nb", "ok\x00"])
def test_names_with_line_breaks_are_refused(name):
    with pytest.raises(InvalidRequestError):
        check_voice_name(name)


def test_damaged_files_of_a_listed_voice_are_a_400_or_a_re_encode(tmp_path):
    registry = VoiceRegistry(tmp_path)
    voice = registry.add("jo", _wav_bytes())
    (tmp_path / "jo" / "codes.npy").write_bytes(b"not numpy")
    assert registry.cached_codes(voice) is None  # unreadable codes: encoded again, no 500
    (tmp_path / "jo" / "audio.wav").unlink()  # removed behind the server's back
    with pytest.raises(InvalidRequestError) as caught:
        registry.load_audio(voice)
    assert caught.value.param == "voice"


def test_a_voice_folder_removed_behind_our_back_can_be_replaced_or_deleted(tmp_path):
    """The advice a damaged voice gets ("delete it and register it again", or overwrite) works
    when its whole folder is gone: both raised FileNotFoundError (a 500) renaming it aside."""
    registry = VoiceRegistry(tmp_path)
    registry.add("kim", _wav_bytes())
    shutil.rmtree(tmp_path / "kim")
    voice, replaced = registry.register("kim", _wav_bytes(0.5), overwrite=True)
    assert replaced and registry.get("kim") is voice and voice.duration_s == 0.5
    assert registry.load_audio(voice).shape == (12000,)
    shutil.rmtree(tmp_path / "kim")
    assert registry.delete("kim") and registry.get("kim") is None
    assert sorted(path.name for path in tmp_path.iterdir()) == []
