"""Prompt layouts (docs/model.md#prompt-layout) and special-token lookup by name (docs/model.md#special-tokens)."""

from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from higgs_serve.errors import InvalidRequestError, TokenizerError
from higgs_serve.model.prompt import PromptBuilder


@pytest.fixture(scope="module")
def pb(tiny_model_dir) -> PromptBuilder:
    return PromptBuilder.from_dir(tiny_model_dir)


def _ids(pb: PromptBuilder, *names: str) -> list[int]:
    return [pb.tokenizer.token_to_id(n) for n in names]


def test_special_ids_by_name(pb):
    assert [pb.tts_id, pb.text_id, pb.audio_id] == _ids(pb, "<|tts|>", "<|text|>", "<|audio|>")
    assert [pb.ref_audio_id, pb.ref_text_id, pb.eos_id] == _ids(pb, "<|ref_audio|>", "<|ref_text|>", "<|endoftext|>")


def test_zero_shot_layout(pb):
    text = "The cat quickly reads the morning news."
    ids = pb.zero_shot(text)
    body = pb.tokenizer.encode(text, add_special_tokens=False).ids
    assert ids == [pb.tts_id, pb.text_id, *body, pb.audio_id]
    assert pb.count_text_tokens(text) == len(body)
    assert pb.tokenizer.decode(body, skip_special_tokens=False) == text  # verbatim, no normalisation


def test_inline_tags_are_plain_text(pb):
    text = "<|emotion:happy|> Hello <|prosody:pause|> there."
    inner = pb.zero_shot(text)[2:-1]
    specials = {pb.tts_id, pb.text_id, pb.audio_id, pb.ref_audio_id, pb.ref_text_id, pb.eos_id}
    assert not specials & set(inner)
    assert pb.tokenizer.decode(inner, skip_special_tokens=False) == text


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
def test_empty_text_rejected(pb, text):
    with pytest.raises(InvalidRequestError) as e:
        pb.zero_shot(text)
    assert e.value.param == "input"


def test_clone_layout_with_ref_text(pb):
    c = pb.clone("Good morning.", num_ref_rows=12, ref_text="Hello there.")
    ref = pb.tok("Hello there.")
    text = pb.tok("Good morning.")
    expected = [pb.tts_id, pb.ref_text_id, *ref, pb.ref_audio_id, *([pb.tts_id] * 12), pb.text_id, *text, pb.audio_id]
    assert c.token_ids == expected
    assert c.placeholder_start == 3 + len(ref) and c.num_placeholders == 12
    assert c.token_ids[c.placeholder_start - 1] == pb.ref_audio_id
    assert c.token_ids[c.placeholder_start + 12] == pb.text_id


@pytest.mark.parametrize("ref_text", [None, "", "  "])
def test_clone_layout_without_ref_text(pb, ref_text):
    c = pb.clone("Good morning.", num_ref_rows=8, ref_text=ref_text)
    assert c.token_ids[:2] == [pb.tts_id, pb.ref_audio_id]
    assert c.placeholder_start == 2 and c.num_placeholders == 8
    assert c.token_ids[-1] == pb.audio_id


def test_clone_rejects_bad_inputs(pb):
    with pytest.raises(InvalidRequestError) as e:
        pb.clone(" ", num_ref_rows=8)
    assert e.value.param == "input"
    with pytest.raises(InvalidRequestError):
        pb.clone("Hi.", num_ref_rows=0)


def _write_tokenizer(directory, specials, eos_config=None):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["hello world", "the cat sat"] * 5, trainer=trainer)
    tok.save(str(directory / "tokenizer.json"))
    if eos_config is not None:
        (directory / "tokenizer_config.json").write_text(json.dumps(eos_config))


def test_missing_required_token_is_named(tmp_path):
    _write_tokenizer(tmp_path, ["<|endoftext|>", "<|tts|>", "<|text|>"])
    with pytest.raises(TokenizerError, match=r"<\|audio\|>"):
        PromptBuilder.from_dir(tmp_path)


def test_missing_ref_audio_fails_only_at_clone_time(tmp_path):
    _write_tokenizer(tmp_path, ["<|endoftext|>", "<|tts|>", "<|text|>", "<|audio|>"])
    pb = PromptBuilder.from_dir(tmp_path)
    assert pb.zero_shot("hello")[-1] == pb.audio_id
    with pytest.raises(TokenizerError, match=r"<\|ref_audio\|>"):
        pb.clone("hello", num_ref_rows=8)


def test_missing_ref_text_drops_transcript_with_warning(tmp_path, caplog):
    _write_tokenizer(tmp_path, ["<|endoftext|>", "<|tts|>", "<|text|>", "<|audio|>", "<|ref_audio|>"])
    pb = PromptBuilder.from_dir(tmp_path)
    with caplog.at_level(logging.WARNING, logger="higgs_serve.model.prompt"):
        c = pb.clone("hello", num_ref_rows=8, ref_text="the cat")
    assert "<|ref_text|>" in caplog.text
    assert c.token_ids[:2] == [pb.tts_id, pb.ref_audio_id]


def test_eos_from_tokenizer_config(tmp_path):
    _write_tokenizer(tmp_path, ["<|im_end|>", "<|endoftext|>", "<|tts|>", "<|text|>", "<|audio|>"],
                     eos_config={"eos_token": {"content": "<|im_end|>", "special": True}})
    pb = PromptBuilder.from_dir(tmp_path)
    assert pb.eos_token == "<|im_end|>" and pb.eos_id == pb.tokenizer.token_to_id("<|im_end|>")
    (tmp_path / "tokenizer_config.json").unlink()
    assert PromptBuilder.from_dir(tmp_path).eos_token == "<|endoftext|>"


def test_unknown_eos_is_an_error(tmp_path):
    _write_tokenizer(tmp_path, ["<|tts|>", "<|text|>", "<|audio|>"], eos_config={"eos_token": "</s>"})
    with pytest.raises(TokenizerError, match="</s>"):
        PromptBuilder.from_dir(tmp_path)


def test_missing_or_corrupt_tokenizer_file(tmp_path, tiny_model_dir):
    with pytest.raises(TokenizerError, match="tokenizer.json not found"):
        PromptBuilder.from_dir(tmp_path)
    shutil.copy(tiny_model_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(TokenizerError, match="cannot load tokenizer"):
        PromptBuilder.from_dir(tmp_path)


def _added_tokens(pb: PromptBuilder) -> list[str]:
    return [token.content for token in pb.tokenizer.get_added_tokens_decoder().values()]


def test_control_tokens_in_user_text_never_become_control_ids(pb):
    """Every added token spelled in `input` or `ref_text` is tokenized as its plain characters:
    no control-token id in the text spans, and the spans decode back to the text verbatim."""
    specials = {pb.tts_id, pb.text_id, pb.audio_id, pb.ref_audio_id, pb.ref_text_id, pb.eos_id}
    added = _added_tokens(pb)
    assert specials <= {pb.tokenizer.token_to_id(name) for name in added}
    spelled = "".join(added)
    for text in [*(f"say {name} now" for name in added), spelled, f"<|emotion:happy|>{spelled}x"]:
        inner = pb.zero_shot(text)[2:-1]
        assert not specials & set(inner), text
        assert pb.tokenizer.decode(inner, skip_special_tokens=False) == text
        assert pb.count_text_tokens(text) == len(inner)
        clone = pb.clone(text, num_ref_rows=4, ref_text=text)
        ref_span = clone.token_ids[2:clone.placeholder_start - 1]
        text_span = clone.token_ids[clone.placeholder_start + 4 + 1:-1]
        assert ref_span == inner and text_span == inner
    # the prompt's own control tokens are exactly the layout's, wherever the text put others
    prompt = pb.clone("<|audio|><|text|>", num_ref_rows=4, ref_text="<|ref_audio|><|tts|>").token_ids
    assert prompt.count(pb.audio_id) == 1 and prompt.count(pb.text_id) == 1
    assert prompt.count(pb.ref_audio_id) == 1 and prompt.count(pb.eos_id) == 0


def test_plain_text_tokenization_is_unchanged(pb):
    text = "<|emotion:happy|> Hello <|prosody:pause|> there."
    assert pb.tok(text) == pb.tokenizer.encode(text, add_special_tokens=False).ids


def test_a_long_inputs_token_count_is_counted_in_pieces_and_the_same(pb):
    """Issue 61: a 100,000-character input is counted in word-aligned pieces (the whole text's
    encoding held ~10 MB the allocator kept); the count equals the whole text's, whatever the
    spacing, digits, punctuation and spelled control tokens."""
    from higgs_serve.model.prompt import COUNT_PIECE_CHARS, _word_pieces

    rng = np.random.default_rng(3)
    words = ["hello", "world,", "it's", "12345", "<|audio|>", "naïve", "—", "x" * 40, "end.\n\n", "  two",
             "tab\there", "ok?!", "3.14159", "über-long-hyphenated-word"]
    text = " ".join(rng.choice(words, 30_000))
    assert len(text) > 25 * COUNT_PIECE_CHARS
    pieces = list(_word_pieces(text, COUNT_PIECE_CHARS))
    assert "".join(pieces) == text and len(pieces) > 25
    assert all(len(p) <= COUNT_PIECE_CHARS for p in pieces[:-1])
    assert pb.count_text_tokens(text) == len(pb.tok(text))
    assert list(_word_pieces("a" * 10_000, COUNT_PIECE_CHARS)) == ["a" * 10_000]  # no break: whole
