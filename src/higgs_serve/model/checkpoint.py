"""Locate a model (directory or hub id), read (sharded) safetensors, split and check tensors.

docs/model.md#checkpoint-layout. Loading is strict and loud: a missing required tensor, a wrong shape or an unknown
name is a `CheckpointError` naming the tensor. Talker tensors are renamed to internal names by
the declarative table `TALKER_RENAMES`; codec tensors (under `CODEC_PREFIX`) are prefix-stripped,
weight-norm folded and checked by `codec/weights.load_codec_tensors`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor

from higgs_serve.codec.weights import CODEC_PREFIX, load_codec_tensors
from higgs_serve.errors import CheckpointError
from higgs_serve.model.hf_config import ModelSpec
from higgs_serve.model.talker import talker_tensor_shapes
from higgs_serve.progress import ProgressCallback

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
HUB_ALLOW_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.txt", "*.model"]

# checkpoint name -> internal (Talker) name; `{i}` is a layer index. One row per tensor kind.
TALKER_RENAMES: tuple[tuple[str, str], ...] = (
    ("tied.embedding.text_embedding.weight", "text_embedding.weight"),
    ("tied.embedding.modality_embeddings.0.embedding.weight", "audio_embedding.weight"),
    ("tied.head.modality_heads.0.weight", "audio_head.weight"),  # only when audio is untied
    ("body.norm.weight", "norm.weight"),
    ("body.layers.{i}.input_layernorm.weight", "layers.{i}.input_norm.weight"),
    ("body.layers.{i}.post_attention_layernorm.weight", "layers.{i}.post_attention_norm.weight"),
    ("body.layers.{i}.self_attn.q_proj.weight", "layers.{i}.q_proj.weight"),
    ("body.layers.{i}.self_attn.k_proj.weight", "layers.{i}.k_proj.weight"),
    ("body.layers.{i}.self_attn.v_proj.weight", "layers.{i}.v_proj.weight"),
    ("body.layers.{i}.self_attn.o_proj.weight", "layers.{i}.o_proj.weight"),
    ("body.layers.{i}.self_attn.q_norm.weight", "layers.{i}.q_norm.weight"),
    ("body.layers.{i}.self_attn.k_norm.weight", "layers.{i}.k_norm.weight"),
    ("body.layers.{i}.mlp.gate_proj.weight", "layers.{i}.gate_proj.weight"),
    ("body.layers.{i}.mlp.up_proj.weight", "layers.{i}.up_proj.weight"),
    ("body.layers.{i}.mlp.down_proj.weight", "layers.{i}.down_proj.weight"),
)
# Present in real checkpoints but never needed: the text LM head (every audio step's token is forced).
IGNORED_TALKER_TENSORS = frozenset({"tied.head.text_head.weight"})


def _template_re(template: str) -> re.Pattern[str]:
    return re.compile(re.escape(template).replace(re.escape("{i}"), r"(?P<i>\d+)"))


_TO_INTERNAL = tuple((_template_re(ck), internal) for ck, internal in TALKER_RENAMES)
_TO_CHECKPOINT = tuple((_template_re(internal), ck) for ck, internal in TALKER_RENAMES)


def to_internal_name(checkpoint_name: str) -> str | None:
    """The Talker name of a checkpoint talker tensor, or None when the table has no row for it."""
    for pattern, internal in _TO_INTERNAL:
        m = pattern.fullmatch(checkpoint_name)
        if m:
            return internal.replace("{i}", m.group("i")) if "i" in m.groupdict() else internal
    return None


def to_checkpoint_name(internal_name: str) -> str:
    for pattern, ck in _TO_CHECKPOINT:
        m = pattern.fullmatch(internal_name)
        if m:
            return ck.replace("{i}", m.group("i")) if "i" in m.groupdict() else ck
    raise KeyError(internal_name)


def expected_talker_checkpoint_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Checkpoint name -> shape of every required talker tensor."""
    return {to_checkpoint_name(n): s for n, s in talker_tensor_shapes(spec.text, spec.audio).items()}


# ---------------------------------------------------------------------------------------------
# locating and reading


def resolve_model_dir(model: str) -> Path:
    """An existing local directory, else a hub id fetched with `huggingface_hub.snapshot_download`."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise CheckpointError(f"model {model!r} is a file, not a model directory")
    if model.startswith((".", "/", "~")) or model.count("/") != 1:
        raise CheckpointError(f"model directory {model!r} does not exist (and it is not a hub id 'owner/name')")
    # Imported here: only hub ids need it, and it is slow to import.
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        return Path(snapshot_download(model, allow_patterns=HUB_ALLOW_PATTERNS))
    except LocalEntryNotFoundError as e:
        raise CheckpointError(
            f"model {model!r} is not in the local Hugging Face cache and this machine cannot download it "
            f"({e.__class__.__name__}). Download it on a machine with internet access "
            f"(`hf download {model} --local-dir DIR`, huggingface_hub's CLI) and pass DIR, "
            f"or copy it into the cache."
        ) from e
    except (RepositoryNotFoundError, GatedRepoError, RevisionNotFoundError) as e:
        raise CheckpointError(f"model {model!r} cannot be downloaded from the hub: {e.__class__.__name__}: {e}") from e
    except HFValidationError as e:
        raise CheckpointError(f"model {model!r} is neither a directory nor a valid hub id: {e}") from e


def read_safetensors(model_dir: Path, on_progress: ProgressCallback | None = None) -> dict[str, Tensor]:
    """All tensors of `model.safetensors`, or of every shard listed in `model.safetensors.index.json`.

    on_progress(done, total, "loading weights") is called as tensors are read (total: every
    tensor in every file), so a long read shows it is moving.
    """
    model_dir = Path(model_dir)
    single, index = model_dir / SAFETENSORS_FILE, model_dir / SAFETENSORS_INDEX
    if single.is_file():
        return _read_files([single], on_progress)
    if not index.is_file():
        raise CheckpointError(f"{model_dir}: neither {SAFETENSORS_FILE} nor {SAFETENSORS_INDEX} found")
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise CheckpointError(f"{index}: not a valid safetensors index (needs a 'weight_map' object): {e}") from e
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index}: 'weight_map' must be an object")
    shard_paths = []
    for shard in sorted(set(weight_map.values())):
        shard_path = model_dir / shard
        if not shard_path.is_file():
            raise CheckpointError(f"{index}: shard file {shard} is missing from {model_dir}")
        shard_paths.append(shard_path)
    tensors = _read_files(shard_paths, on_progress)
    for name, shard in weight_map.items():
        if name not in tensors:
            raise CheckpointError(f"{index}: tensor {name} is listed in shard {shard} but not stored there")
    return tensors


def _read_files(paths: list[Path], on_progress: ProgressCallback | None) -> dict[str, Tensor]:
    """Every tensor of every file, one by one (a name in two files is an error)."""
    files = [(path, _open_file(path)) for path in paths]
    total = sum(len(handle.keys()) for _, handle in files)
    tensors: dict[str, Tensor] = {}
    if on_progress is not None:
        on_progress(0, total, "loading weights")
    for path, handle in files:
        for name in handle.keys():
            if name in tensors:
                raise CheckpointError(f"{path}: tensor {name} appears in more than one shard")
            try:
                tensors[name] = handle.get_tensor(name)
            except (SafetensorError, OSError) as e:
                raise CheckpointError(f"{path}: cannot read tensor {name}: {e}") from e
            if on_progress is not None:
                on_progress(len(tensors), total, "loading weights")
    return tensors


def _open_file(path: Path):
    try:
        return safe_open(str(path), framework="pt")
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{path}: cannot read safetensors file: {e}") from e


# ---------------------------------------------------------------------------------------------
# weight norm


def fold_weight_norm(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """Replace weight-norm pairs by plain weights: w = g * v / ||v||.

    Both naming styles: `X.weight_g` / `X.weight_v` and
    `X.parametrizations.weight.original0` (g) / `.original1` (v) become `X.weight`. The norm is
    taken over every dim where g has size 1 (torch keeps the norm dim at full size). Folded
    weights are float32, since the codec runs in float32 (docs/model.md#codec-geometry).
    """
    out: dict[str, Tensor] = {}
    pairs: dict[str, dict[str, tuple[str, Tensor]]] = {}  # folded name -> role ("g"/"v") -> (name, tensor)
    for name, t in tensors.items():
        m = _WN_RE.fullmatch(name)
        if m is None:
            out[name] = t
            continue
        role = "g" if m.group("old") == "g" or m.group("new") == "0" else "v"
        base = m.group("base")
        pairs.setdefault(f"{base}.weight" if base else "weight", {})[role] = (name, t)
    for weight_name, pair in pairs.items():
        if len(pair) != 2:
            (have, _), = pair.values()
            lacking = "magnitude (g)" if "g" not in pair else "direction (v)"
            raise CheckpointError(f"weight-norm tensor {have} has no matching {lacking} partner")
        if weight_name in out:
            raise CheckpointError(f"{weight_name} is stored both plain and as a weight-norm pair")
        out[weight_name] = _fold(pair["g"][1], pair["v"][1], weight_name)
    return out


_WN_RE = re.compile(r"(?:(?P<base>.+?)\.)?(?:weight_(?P<old>[gv])|parametrizations\.weight\.original(?P<new>[01]))")


def _fold(g: Tensor, v: Tensor, name: str) -> Tensor:
    if g.ndim != v.ndim or any(gs not in (1, vs) for gs, vs in zip(g.shape, v.shape)):
        raise CheckpointError(f"weight-norm pair for {name}: g shape {tuple(g.shape)} does not broadcast "
                              f"against v shape {tuple(v.shape)}")
    norm_dims = [d for d in range(v.ndim) if g.shape[d] == 1]
    v32 = v.float()
    norm = v32.pow(2).sum(dim=norm_dims, keepdim=True).sqrt() if norm_dims else v32.abs()
    return g.float() * v32 / norm


# ---------------------------------------------------------------------------------------------
# splitting and strict checks


class LoadedCheckpoint(NamedTuple):
    """Unpacks as `talker, codec = ...` too."""

    talker: dict[str, Tensor]  # internal names (Talker.load_talker_weights)
    codec: dict[str, Tensor]  # prefix-stripped, folded, required names only (codec/weights.py)


def split_checkpoint(tensors: dict[str, Tensor], spec: ModelSpec, where: str = "checkpoint"
                     ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """(talker tensors by internal name, codec tensors prefix-stripped and folded), strictly checked."""
    expected = expected_talker_checkpoint_shapes(spec)
    talker: dict[str, Tensor] = {}
    codec_raw: dict[str, Tensor] = {}
    for name, t in tensors.items():
        if name.startswith(CODEC_PREFIX):
            codec_raw[name] = t
        elif name in IGNORED_TALKER_TENSORS:
            continue
        elif name in expected:
            if tuple(t.shape) != expected[name]:
                raise CheckpointError(f"{where}: tensor {name} has shape {list(t.shape)}, "
                                      f"expected {list(expected[name])}")
            talker[to_internal_name(name)] = t  # type: ignore[index]
        else:
            why = (" (the audio head is tied to the audio embedding in this config)"
                   if name == "tied.head.modality_heads.0.weight" else "")
            raise CheckpointError(f"{where}: unexpected tensor {name}{why}")
    missing = [n for n in expected if to_internal_name(n) not in talker]
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise CheckpointError(f"{where}: missing talker tensor {', '.join(missing[:5])}{more}")
    # Fold before stripping the prefix, so a broken weight-norm pair is named in full.
    folded = {n[len(CODEC_PREFIX):]: t for n, t in fold_weight_norm(codec_raw).items()}
    codec = load_codec_tensors(spec.codec, folded, where)
    return talker, codec


def load_checkpoint(model_dir: Path, spec: ModelSpec, on_progress: ProgressCallback | None = None
                    ) -> LoadedCheckpoint:
    """Read and split the checkpoint in `model_dir` (CPU tensors in their stored dtypes)."""
    talker, codec = split_checkpoint(read_safetensors(model_dir, on_progress), spec, where=str(model_dir))
    return LoadedCheckpoint(talker=talker, codec=codec)


def cast_tensors(tensors: dict[str, Tensor], dtype: torch.dtype, device: torch.device | str) -> dict[str, Tensor]:
    """Move every floating tensor to `device` and `dtype` (integer tensors keep their dtype)."""
    return {n: t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype) for n, t in tensors.items()}
