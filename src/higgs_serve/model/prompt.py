"""Tokenizer wrapper and prompt building (docs/model.md#special-tokens and #prompt-layout).

No chat template, no system prompt, no BOS. Special tokens are looked up by name in the added
vocabulary, never by number. `tok(x)` encodes user text (`input`, `ref_text`) verbatim as plain
text: inline tags such as `<|emotion:happy|>` are plain text, and so is a control token's spelling
(`<|audio|>`, `<|endoftext|>`, any added token): the tokenizer library matches added tokens even
with add_special_tokens=False, so text that would produce an added-token id is re-encoded through
the normalizer, pre-tokenizer and BPE model alone, which know no added tokens. User text can
therefore never place a control token in the prompt; it reads as the characters it spells.

- zero-shot: `<|tts|> <|text|> tok(text) <|audio|>`
- clone:     `<|tts|> [<|ref_text|> tok(ref_text)] <|ref_audio|> P × num_ref_rows <|text|> tok(text) <|audio|>`

P positions are filled with the `<|tts|>` id (a valid id that the audio state machine can never
mistake for `<|audio|>`); the runner overwrites their embeddings with the fused audio embedding
of the delayed reference rows.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from higgs_serve.errors import InvalidRequestError, TokenizerError

logger = logging.getLogger(__name__)

TTS, TEXT, AUDIO = "<|tts|>", "<|text|>", "<|audio|>"
REF_AUDIO, REF_TEXT = "<|ref_audio|>", "<|ref_text|>"
DEFAULT_EOS = "<|endoftext|>"
REQUIRED_TOKENS = (TTS, TEXT, AUDIO)


@dataclass(frozen=True)
class ClonePrompt:
    token_ids: list[int]
    placeholder_start: int  # index of the first P position
    num_placeholders: int  # = number of delayed reference rows (T_ref + 7)


class PromptBuilder:
    def __init__(self, tokenizer: Tokenizer, eos_token: str = DEFAULT_EOS, where: str = "tokenizer"):
        self.tokenizer = tokenizer
        self.where = where
        added = {tok.content: idx for idx, tok in tokenizer.get_added_tokens_decoder().items()}
        for name in REQUIRED_TOKENS:
            if name not in added:
                raise TokenizerError(f"{where}: required special token {name} is not in the added vocabulary")
        self.tts_id, self.text_id, self.audio_id = (added[n] for n in REQUIRED_TOKENS)
        self.ref_audio_id: int | None = added.get(REF_AUDIO)
        self.ref_text_id: int | None = added.get(REF_TEXT)
        eos_id = tokenizer.token_to_id(eos_token)
        if eos_id is None:
            raise TokenizerError(f"{where}: EOS token {eos_token!r} is not in the vocabulary")
        self.eos_token, self.eos_id = eos_token, eos_id
        self._added_ids = frozenset(added.values())  # control tokens: never from user text

    @classmethod
    def from_dir(cls, model_dir: Path) -> PromptBuilder:
        """Load `tokenizer.json` (and the EOS name from `tokenizer_config.json`, if present)."""
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(f"{path}: tokenizer.json not found")
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as e:  # noqa: BLE001 - the tokenizers library raises a bare Exception on a bad file
            raise TokenizerError(f"{path}: cannot load tokenizer: {e}") from e
        return cls(tokenizer, _eos_name(model_dir / "tokenizer_config.json"), where=str(path))

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def tok(self, text: str) -> list[int]:
        """User text -> plain-text token ids (never an added/control token id)."""
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        if self._added_ids.isdisjoint(ids):
            return ids  # the common case: no control token spelled in the text
        return self._plain_ids(text)

    def _plain_ids(self, text: str) -> list[int]:
        """Encode without the added vocabulary: normalizer, pre-tokenizer, then the BPE model, as
        the library does for text between added tokens. `<|audio|>` becomes `<|`, `audio`, `|>`."""
        tokenizer = self.tokenizer
        if tokenizer.normalizer is not None:
            text = tokenizer.normalizer.normalize_str(text)
        pieces = (tokenizer.pre_tokenizer.pre_tokenize_str(text)
                  if tokenizer.pre_tokenizer is not None else [(text, None)])
        ids = [token.id for piece, _ in pieces for token in tokenizer.model.tokenize(piece)]
        if not self._added_ids.isdisjoint(ids):  # a vocabulary that spells them in its merges
            raise InvalidRequestError("the text cannot be encoded without control tokens")
        return ids

    def count_text_tokens(self, text: str) -> int:
        """len(tok(text)), counted COUNT_PIECE_CHARS at a time: the library's encoding of a
        100,000-character input holds ~10 MB (offsets, words) that the allocator keeps after it is
        freed (benchmarks/results/README.md, issue 61). The pieces end before a space between two
        words, where the byte-level pre-tokenizer starts a word anyway, so the count is the same."""
        return sum(len(self.tok(piece)) for piece in _word_pieces(text, COUNT_PIECE_CHARS))

    def zero_shot(self, text: str) -> list[int]:
        """`<|tts|> <|text|> tok(text) <|audio|>`."""
        return [self.tts_id, self.text_id, *self._text_ids(text, "input"), self.audio_id]

    def clone(self, text: str, num_ref_rows: int, ref_text: str | None = None) -> ClonePrompt:
        """`<|tts|> [<|ref_text|> tok(ref_text)] <|ref_audio|> P×num_ref_rows <|text|> tok(text) <|audio|>`."""
        if self.ref_audio_id is None:
            raise TokenizerError(f"{self.where}: voice cloning needs the special token {REF_AUDIO}, "
                                 "which this checkpoint's tokenizer lacks")
        if num_ref_rows <= 0:
            raise InvalidRequestError(f"reference audio gives {num_ref_rows} rows; it must give at least one",
                                      param="ref_audio")
        ids = [self.tts_id]
        if ref_text is not None and ref_text.strip():
            if self.ref_text_id is None:
                logger.warning("tokenizer lacks %s: the reference transcript is dropped", REF_TEXT)
            else:
                ids += [self.ref_text_id, *self.tok(ref_text)]
        ids.append(self.ref_audio_id)
        start = len(ids)
        ids += [self.tts_id] * num_ref_rows
        ids += [self.text_id, *self._text_ids(text, "input"), self.audio_id]
        return ClonePrompt(token_ids=ids, placeholder_start=start, num_placeholders=num_ref_rows)

    def _text_ids(self, text: str, param: str) -> list[int]:
        if not isinstance(text, str) or not text.strip():
            raise InvalidRequestError("input text must not be empty", param=param)
        return self.tok(text)


def _eos_name(config_path: Path) -> str:
    """`eos_token` from tokenizer_config.json (a string or an AddedToken dict), else `<|endoftext|>`."""
    if not config_path.is_file():
        return DEFAULT_EOS
    try:
        cfg = json.loads(config_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise TokenizerError(f"{config_path}: not valid JSON ({e})") from e
    eos = cfg.get("eos_token") if isinstance(cfg, dict) else None
    if isinstance(eos, dict):
        eos = eos.get("content")
    if eos is None:
        return DEFAULT_EOS
    if not isinstance(eos, str):
        raise TokenizerError(f"{config_path}: eos_token must be a string, got {eos!r}")
    return eos


COUNT_PIECE_CHARS = 4096


def _word_pieces(text: str, max_chars: int):
    """`text` in consecutive pieces of at most max_chars (the rest in one piece once no word break
    is in reach), each after the first starting with the space before a word."""
    start = 0
    while len(text) - start > max_chars:
        cut = text.rfind(" ", start + 1, start + max_chars)
        while cut > start and (text[cut - 1].isspace() or text[cut + 1:cut + 2].isspace()):
            cut = text.rfind(" ", start + 1, cut)  # a run of spaces pre-tokenizes as one: not there
        if cut <= start:
            break  # no word break in reach: the rest as one piece
        yield text[start:cut]
        start = cut
    yield text[start:]
