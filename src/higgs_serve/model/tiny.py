"""The tiny checkpoint writer (`make-tiny-model`) and the dummy-weight builder (`--load-format dummy`).

A tiny model is a complete, loadable checkpoint directory in exactly the real layout (docs/model.md#checkpoint-layout):
config.json, a small real byte-level BPE tokenizer with the Higgs special tokens, and
model.safetensors (optionally sharded) with random weights under the real tensor names, the full
codec under `CODEC_PREFIX` and a few training-only codec tensors to exercise the ignore rule.
Random values are scaled so the talker and the codec produce finite, non-degenerate output:
norms 1 ± 0.1, matrices N(0, 1/fan_in), snake alphas in [0.5, 1.5), codebooks N(0, 1).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from torch import Tensor

from higgs_serve.codec.codec_config import CodecConfig
from higgs_serve.codec.weights import CODEC_PREFIX, expected_codec_tensors
from higgs_serve.model.checkpoint import (
    SAFETENSORS_FILE,
    SAFETENSORS_INDEX,
    LoadedCheckpoint,
    to_checkpoint_name,
)
from higgs_serve.model.hf_config import AudioConfig, ModelSpec, TextConfig, spec_to_config_dict
from higgs_serve.model.prompt import AUDIO, DEFAULT_EOS, REF_AUDIO, REF_TEXT, TEXT, TTS
from higgs_serve.model.talker import talker_tensor_shapes
from higgs_serve.progress import ProgressCallback

SPECIAL_TOKENS = [DEFAULT_EOS, TTS, TEXT, AUDIO, REF_AUDIO, REF_TEXT]  # ids 0..5 in the tiny tokenizer
PRESETS = ("tiny", "4b")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# ---------------------------------------------------------------------------------------------
# tokenizer


def build_tiny_tokenizer(vocab_size: int = 600) -> Tokenizer:
    """A real byte-level BPE trained on generated English sentences (deterministic, ~10 ms)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return tok


def _corpus(n: int = 400) -> list[str]:
    rng = random.Random(1234)
    subjects = ["The cat", "A small dog", "My neighbour", "The old teacher", "Our team", "She", "He", "The robot",
                "A young girl", "The captain", "Everyone", "The singer"]
    verbs = ["reads", "finds", "watches", "builds", "paints", "remembers", "carries", "opens", "sings about",
             "walks past", "quickly reads", "writes"]
    objects = ["the morning news", "a red bicycle", "the quiet river", "an old letter", "the bright window",
               "a long story", "the kitchen door", "seven green apples", "the mountain road", "a new song"]
    tails = [".", " today.", " again.", " before dinner.", " in the rain!", " with great care.", "?",
             ", and then smiles.", " at noon.", " for the first time."]
    return [f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}{rng.choice(tails)}" for _ in range(n)]


# ---------------------------------------------------------------------------------------------
# specs


def tiny_spec(vocab_size: int) -> ModelSpec:
    return ModelSpec(text=TextConfig.preset_tiny(vocab_size), audio=AudioConfig(), codec=CodecConfig.tiny(),
                     torch_dtype="float32")


def spec_4b() -> ModelSpec:
    return ModelSpec(text=TextConfig.preset_4b(), audio=AudioConfig(), codec=CodecConfig(), torch_dtype="bfloat16")


# ---------------------------------------------------------------------------------------------
# random weights


@torch.no_grad()
def build_dummy_tensors(spec: ModelSpec, dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cpu",
                        seed: int = 0, on_progress: ProgressCallback | None = None) -> LoadedCheckpoint:
    """Random talker (internal names, `dtype`) and codec (float32) tensors from the spec alone.

    Generated on `device` with one seeded generator, tensor by tensor in sorted name order, so the
    result is deterministic per (seed, device). No Python loops over elements.
    on_progress(done, total, "building random weights") follows the tensors (the 4B geometry
    takes minutes on a CPU).
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    talker_shapes = sorted(talker_tensor_shapes(spec.text, spec.audio).items())
    codec_shapes = sorted(expected_codec_tensors(spec.codec).items())
    total = len(talker_shapes) + len(codec_shapes)

    def build(shapes, tensor_dtype, start: int) -> dict[str, Tensor]:
        out = {}
        for i, (name, shape) in enumerate(shapes):
            out[name] = _random_tensor(name, shape, gen, tensor_dtype, device)
            if on_progress is not None:
                on_progress(start + i + 1, total, "building random weights")
        return out

    if on_progress is not None:
        on_progress(0, total, "building random weights")
    talker = build(talker_shapes, dtype, 0)
    codec = build(codec_shapes, torch.float32, len(talker_shapes))
    return LoadedCheckpoint(talker=talker, codec=codec)


def _random_tensor(name: str, shape: tuple[int, ...], gen: torch.Generator, dtype: torch.dtype,
                   device: torch.device | str) -> Tensor:
    def randn() -> Tensor:
        return torch.randn(shape, generator=gen, device=device, dtype=torch.float32)

    leaf = name.rsplit(".", 2)
    if name.endswith(".alpha"):  # snake: positive
        t = torch.rand(shape, generator=gen, device=device) + 0.5
    elif name.endswith("codebook.embed"):
        t = randn()
    elif len(shape) == 1 and "norm" in leaf[-2] and leaf[-1] == "weight":
        t = 1.0 + 0.1 * randn()
    elif len(shape) == 1:  # biases (and norm biases)
        t = 0.05 * randn()
    elif name.endswith("conv_t1.weight"):  # ConvTranspose1d [in, out, 2s]: each output sees in * 2 taps
        t = randn() / (shape[0] * 2) ** 0.5
    elif name == "text_embedding.weight":
        t = randn()
    elif name in ("audio_embedding.weight", "audio_head.weight"):
        # logits = h · W_aᵀ with |h| ≈ sqrt(D): std 2/sqrt(D) gives logits of std ~2, so sampling
        # from a random model is neither uniform nor greedy.
        t = randn() * (2.0 / shape[1] ** 0.5)
    else:
        fan_in = 1
        for s in shape[1:]:
            fan_in *= s
        t = randn() / fan_in ** 0.5 * _gain(name)
    return t.to(dtype)


def _gain(name: str) -> float:
    """Extra gains that keep a random DAC's waveform in audio range (|x| < 1, std ~0.1): each of the
    15 residual units would otherwise double the signal variance (~1000x amplitude overall)."""
    if re.search(r"\.res_unit\d\.conv2\.weight$", name):
        return 0.1
    if name == "acoustic_decoder.conv2.weight":
        return 0.04
    return 1.0


# ---------------------------------------------------------------------------------------------
# writer


def write_tiny_model(directory: Path, seed: int = 0, preset: str = "tiny", config_only: bool = False,
                     shards: int = 1) -> ModelSpec:
    """Write a complete checkpoint directory; returns its spec. Deterministic per seed.

    preset "tiny": a 2-layer 64-wide Qwen3 and `CodecConfig.tiny()` (runs in milliseconds on CPU).
    preset "4b": the real 4B geometry and the default codec (no `audio_tokenizer_config`); use
    config_only=True unless you really want ~9 GB of random weights on disk.
    """
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {PRESETS}, got {preset!r}")
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer()
    spec = tiny_spec(tokenizer.get_vocab_size(with_added_tokens=True)) if preset == "tiny" else spec_4b()
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": DEFAULT_EOS, "pad_token": DEFAULT_EOS, "tokenizer_class": "PreTrainedTokenizerFast"},
        indent=2) + "\n")
    config = spec_to_config_dict(spec, include_codec=preset == "tiny")
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if not config_only:
        _write_safetensors(directory, checkpoint_tensors(spec, seed), shards)
    return spec


def checkpoint_tensors(spec: ModelSpec, seed: int = 0) -> dict[str, Tensor]:
    """Random CPU tensors under the real checkpoint names, plus training-only codec tensors."""
    dummy = build_dummy_tensors(spec, _DTYPES[spec.torch_dtype], "cpu", seed)
    out = {to_checkpoint_name(n): t.contiguous() for n, t in dummy.talker.items()}
    out.update({CODEC_PREFIX + n: t.contiguous() for n, t in dummy.codec.items()})
    # Training-only codec buffers a real checkpoint carries; the loader must accept and drop them.
    gen = torch.Generator().manual_seed(seed + 1)
    cb = spec.codec
    for q in range(cb.num_quantizers):
        p = f"{CODEC_PREFIX}quantizer.quantizers.{q}.codebook."
        out[p + "embed_avg"] = torch.randn(cb.codebook_size, cb.codebook_dim, generator=gen)
        out[p + "cluster_size"] = torch.ones(cb.codebook_size)
        out[p + "inited"] = torch.ones(1)
    return out


def _write_safetensors(directory: Path, tensors: dict[str, Tensor], shards: int) -> None:
    metadata = {"format": "pt"}
    if shards == 1:
        save_file(tensors, str(directory / SAFETENSORS_FILE), metadata=metadata)
        return
    names = sorted(tensors)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    groups: list[list[str]] = [[] for _ in range(shards)]
    done = 0
    for name in names:  # fill shards in order, each up to ~total/shards bytes
        k = min(shards - 1, done * shards // max(total, 1))
        groups[k].append(name)
        done += tensors[name].numel() * tensors[name].element_size()
    weight_map: dict[str, str] = {}
    for k, group in enumerate(groups):
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in group}, str(directory / fname), metadata=metadata)
        weight_map.update({n: fname for n in group})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / SAFETENSORS_INDEX).write_text(json.dumps(index, indent=2) + "\n")
