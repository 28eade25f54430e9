"""Greedy generation, step by step, against a plain reference loop on transformers' `Qwen3Model`.

Our engine (CPU, chunked prefill with an 8-token budget, two requests running concurrently)
generates greedily on the tiny checkpoint. The reference is built independently of our model
code: transformers' `Qwen3Model` in float32 with the checkpoint's talker tensors read straight
from the safetensors file, the fused audio table W_a as a plain tensor, the prompt ids from the
`tokenizers` library, and the delay/ramp/min-length/frame-cap masks of docs/model.md#delay-pattern written out below.

Teacher forcing: the reference input is the prompt's token embeddings followed, for t ≥ 1, by
e(row_{t−1}) = Σ_q W_a[q·1026 + row_{t−1,q}] of OUR row t−1; one causal forward gives every
step's hidden state, and every row of ours must equal the argmax of the reference logits under
the masks, in all 8 codebooks. The row count must follow the stop rule (done 7 rows after the
row whose codebook 0 is EOC).
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from transformers import Qwen3Config, Qwen3Model

from higgs_serve.config.loader import load_deploy_config
from higgs_serve.engine.async_engine import SyncEngine
from higgs_serve.engine.builder import RuntimeOptions
from higgs_serve.engine.speech import SpeechRequest
from higgs_serve.sampling_params import SamplingParams

NUM_CODEBOOKS = 8
VOCAB = 1026  # per codebook: 1024 real codes + BOC + EOC
BOC, EOC = 1024, 1025
MAX_DELAY = NUM_CODEBOOKS - 1
MIN_FRAMES = 8  # docs/model.md#length-caps: codebook 0 may not emit EOC before this row

# checkpoint tensor names (docs/model.md#checkpoint-layout)
TEXT_EMBEDDING = "tied.embedding.text_embedding.weight"
AUDIO_TABLE = "tied.embedding.modality_embeddings.0.embedding.weight"
AUDIO_HEAD = "tied.head.modality_heads.0.weight"

MIN_MARGIN = 1e-4  # a top-2 logit gap below this would be a float near-tie, not an engine bug


# ---------------------------------------------------------------------------------------------
# the independent reference


@dataclass(frozen=True)
class Reference:
    model: Qwen3Model  # float32, eager attention
    audio_table: torch.Tensor  # W_a [8·1026, D]
    audio_head: torch.Tensor  # [8·1026, D]: W_a when tied
    tokenizer: Tokenizer


def _reference(model_dir: Path) -> Reference:
    config = json.loads((model_dir / "config.json").read_text())
    text_config = {k: v for k, v in config["text_config"].items() if k != "model_type"}
    qwen = Qwen3Model(Qwen3Config(**text_config, attn_implementation="eager")).eval()
    tensors = load_file(str(model_dir / "model.safetensors"))
    # checkpoint names (docs/model.md#checkpoint-layout) -> transformers names, without our rename table
    state = {"embed_tokens.weight": tensors[TEXT_EMBEDDING]}
    state.update({name[len("body."):]: t for name, t in tensors.items() if name.startswith("body.")})
    qwen.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    table = tensors[AUDIO_TABLE].float()
    tied = config["audio_encoder_config"].get("tie_word_embeddings", True)
    head = table if tied else tensors[AUDIO_HEAD].float()
    return Reference(qwen, table, head, Tokenizer.from_file(str(model_dir / "tokenizer.json")))


def reference_prompt(tokenizer: Tokenizer, text: str) -> list[int]:
    """Zero-shot prompt (docs/model.md#prompt-layout): `<|tts|> <|text|> tok(text) <|audio|>`, no BOS, no template."""
    special = {name: tokenizer.token_to_id(name) for name in ("<|tts|>", "<|text|>", "<|audio|>")}
    assert None not in special.values(), special
    body = tokenizer.encode(text, add_special_tokens=False).ids
    return [special["<|tts|>"], special["<|text|>"], *body, special["<|audio|>"]]


def audio_embedding(table: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """rows [N, 8] int64 -> [N, D]: Σ_q W_a[q·1026 + row_q] (docs/model.md#talker)."""
    offsets = torch.arange(NUM_CODEBOOKS) * VOCAB
    return table[rows + offsets].sum(dim=1)


@torch.no_grad()
def teacher_forced_logits(ref: Reference, prompt: list[int], rows: np.ndarray) -> torch.Tensor:
    """Logits [N, 8, 1026] of every step, feeding our row t−1 as the input of step t."""
    ids = torch.tensor(prompt)
    fed = torch.as_tensor(rows[:-1], dtype=torch.int64)  # rows 0..N−2 are inputs of steps 1..N−1
    embeds = torch.cat([ref.model.embed_tokens(ids), audio_embedding(ref.audio_table, fed)])  # [P+N−1, D]
    hidden = ref.model(inputs_embeds=embeds[None]).last_hidden_state[0]
    steps = hidden[len(prompt) - 1:]  # [N, D]: prompt's last token gives row 0, then one per row
    return (steps @ ref.audio_head.T).view(len(rows), NUM_CODEBOOKS, VOCAB)


def reference_frame_cap(max_new_tokens: int, num_text_tokens: int, prompt_len: int, max_model_len: int) -> int:
    """docs/architecture.md "Length caps" (profile max_tokens is 2048, above every cap here)."""
    text_cap = math.ceil(25 * (4 + 0.5 * num_text_tokens))
    return min(max_new_tokens, text_cap, max_model_len - prompt_len - 8)


def allowed_codes(row: int, ramp_row: int, max_frames: int, min_frames: int) -> torch.Tensor:
    """The mask of one row (docs/model.md#delay-pattern): [8, 1026] bool, True = may be chosen.

    `ramp_row` is k = 1..7 in the ramp after codebook 0's EOC, else 0 (normal mode).
    """
    allowed = torch.ones(NUM_CODEBOOKS, VOCAB, dtype=torch.bool)
    if ramp_row:
        allowed[:ramp_row] = False
        allowed[:ramp_row, EOC] = True  # codebooks 0..k−1 forced to EOC
        allowed[ramp_row:, BOC] = False  # the others: neither BOC nor EOC
        allowed[ramp_row:, EOC] = False
        return allowed
    delay = min(row, MAX_DELAY)  # d after `row` normal rows (it increments after each, up to 7)
    allowed[delay + 1:] = False
    allowed[delay + 1:, BOC] = True  # q > d forced to BOC
    allowed[:delay + 1, BOC] = False  # q ≤ d may not emit BOC
    allowed[1:, EOC] = False  # q > 0 may not emit EOC
    if row < min_frames:
        allowed[0, EOC] = False  # minimum length
    if row == max_frames:
        allowed[0] = False
        allowed[0, EOC] = True  # the frame cap forces the end
    return allowed


@dataclass(frozen=True)
class Replay:
    expected: np.ndarray  # [N', 8]: masked argmax per step, as far as our rows allow
    margins: np.ndarray  # [N', 8]: top-1 minus top-2 among allowed codes (inf when forced)
    eoc_row: int | None  # first row whose codebook 0 is EOC under the reference


def replay(logits: torch.Tensor, max_frames: int, min_frames: int) -> Replay:
    """Greedy under the masks, step by step, with the delay/ramp state machine of docs/model.md#delay-pattern."""
    expected, margins, eoc_row = [], [], None
    for t in range(logits.shape[0]):
        ramp_row = 0 if eoc_row is None else t - eoc_row
        if ramp_row > MAX_DELAY:
            break  # done after the 7th ramp row: any further row of ours is surplus
        masked = logits[t].masked_fill(~allowed_codes(t, ramp_row, max_frames, min_frames), float("-inf"))
        top2 = masked.topk(2, dim=-1).values  # [8, 2]
        expected.append(masked.argmax(dim=-1))
        margins.append(top2[:, 0] - top2[:, 1])  # -inf second place (forced) -> inf margin
        if eoc_row is None and expected[-1][0] == EOC:
            eoc_row = t
    return Replay(torch.stack(expected).numpy(), torch.stack(margins).numpy(), eoc_row)


# ---------------------------------------------------------------------------------------------
# the engine runs


def run_engine(model_dir: Path, requests: tuple[tuple[str, str, int, int], ...]) -> dict:
    """Greedy rows of all `requests`, run concurrently with an 8-token step budget.

    The budget forces chunked prefill, interleaved with the other request's decodes.
    """
    overrides = {
        "0": {"devices": "cpu", "num_gpu_blocks": 256, "max_num_seqs": 4, "max_num_batched_tokens": 8,
              "compilation_config": {"cudagraph_capture_sizes": [1, 2, 4]}},
        "1": {"devices": "cpu"},
    }
    deploy = load_deploy_config(None, "higgs_multimodal_qwen3", cli_overrides=overrides)
    engine = SyncEngine.from_model(str(model_dir), deploy, RuntimeOptions(device="cpu"))
    try:
        batch = [SpeechRequest(rid, text, SamplingParams(temperature=0.0, seed=7, max_new_tokens=n,
                                                         min_new_tokens=m), stream=False)
                 for rid, text, n, m in requests]
        results = {r.request_id: r for r in engine.generate_batch(batch)}
        prompts = {rid: engine.loaded.prompts.zero_shot(text) for rid, text, _, _ in requests}
    finally:
        engine.close()
    return {"results": results, "prompts": prompts, "max_model_len": deploy.stage0.max_model_len}


@torch.no_grad()
def write_steered_checkpoint(source: Path, target: Path) -> None:
    """A copy of `source` whose audio table makes the masks decisive.

    Three rows of W_a (the tied head) are pointed along the mean final hidden state, so these
    codes win every greedy step unless a mask forbids them: codebook 0's EOC (min-length rule,
    natural end), codebook 1's BOC (q ≤ d may not emit BOC; none in the ramp) and codebook 3's
    EOC (q > 0 may not emit EOC). The same table is the input embedding, so the reference sees
    exactly what the engine sees.
    """
    ref = _reference(source)
    prompts = [reference_prompt(ref.tokenizer, text) for _, text, _, _ in PLAIN]
    hidden = torch.cat([ref.model(input_ids=torch.tensor([ids])).last_hidden_state[0] for ids in prompts])
    direction = hidden.mean(dim=0)
    tensors = load_file(str(source / "model.safetensors"))
    table = tensors[AUDIO_TABLE].clone()
    for code in (0 * VOCAB + EOC, 1 * VOCAB + BOC, 3 * VOCAB + EOC):
        table[code] = direction / direction.norm() * 40.0
    tensors[AUDIO_TABLE] = table
    target.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(target / "model.safetensors"))
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        if (source / name).is_file():
            shutil.copyfile(source / name, target / name)


# (request id, text, max_new_tokens, min_new_tokens)
SHORT_TEXT = "The cat sat on the mat."
LONG_TEXT = "The old teacher quickly reads the letter and then writes a long reply to everyone."
PLAIN = (("short", SHORT_TEXT, 30, 0), ("long", LONG_TEXT, 41, 0))  # the random model never ends: frame caps
STEERED = (("stop_min", SHORT_TEXT, 40, 0), ("stop_13", LONG_TEXT, 40, 13))  # natural ends at rows 8 and 13
CASES = [("plain", r) for r in PLAIN] + [("steered", r) for r in STEERED]
CASE_IDS = [f"{kind}-{r[0]}" for kind, r in CASES]


@pytest.fixture(scope="module")
def model_dirs(tiny_model_dir, tmp_path_factory) -> dict[str, Path]:
    steered = tmp_path_factory.mktemp("steered_tiny")
    write_steered_checkpoint(tiny_model_dir, steered)
    return {"plain": tiny_model_dir, "steered": steered}


@pytest.fixture(scope="module")
def runs(model_dirs) -> dict[str, dict]:
    return {"plain": run_engine(model_dirs["plain"], PLAIN), "steered": run_engine(model_dirs["steered"], STEERED)}


@pytest.fixture(scope="module")
def references(model_dirs) -> dict[str, Reference]:
    return {kind: _reference(d) for kind, d in model_dirs.items()}


@pytest.mark.parametrize("kind,request_spec", CASES, ids=CASE_IDS)
def test_prompt_ids_match_the_tokenizers_library(runs, references, kind, request_spec):
    rid, text, _, _ = request_spec
    run, ref = runs[kind], references[kind]
    ids = reference_prompt(ref.tokenizer, text)
    assert run["prompts"][rid] == ids
    assert run["results"][rid].prompt_tokens == len(ids)


@pytest.mark.parametrize("kind,request_spec", CASES, ids=CASE_IDS)
def test_every_greedy_row_is_the_reference_masked_argmax(runs, references, kind, request_spec):
    rid, text, max_new_tokens, min_new_tokens = request_spec
    run, ref = runs[kind], references[kind]
    result = run["results"][rid]
    rows = result.rows  # [N, 8] int64, delayed rows as sampled
    assert rows.ndim == 2 and rows.shape[1] == NUM_CODEBOOKS and rows.dtype == np.int64
    prompt = reference_prompt(ref.tokenizer, text)
    n_text = len(ref.tokenizer.encode(text, add_special_tokens=False).ids)
    max_frames = reference_frame_cap(max_new_tokens, n_text, len(prompt), run["max_model_len"])
    min_frames = min(max(MIN_FRAMES, min_new_tokens), max_frames)
    logits = teacher_forced_logits(ref, prompt, rows)  # [N, 8, 1026]
    got = replay(logits, max_frames, min_frames)

    for t in range(min(len(got.expected), len(rows))):
        bad = np.flatnonzero(got.expected[t] != rows[t])
        assert bad.size == 0, (
            f"{rid}: row {t} codebooks {bad.tolist()}: engine chose {rows[t, bad].tolist()}, reference "
            f"masked argmax {got.expected[t, bad].tolist()} (top-2 margins {got.margins[t, bad].tolist()}); "
            f"row {t} engine {rows[t].tolist()} vs reference {got.expected[t].tolist()}")
    # stop rule: done 7 ramp rows after the row whose codebook 0 is EOC (the cap forces it at max_frames)
    assert got.eoc_row is not None, f"{rid}: the reference never ends within our {len(rows)} rows"
    assert len(rows) == got.eoc_row + 1 + MAX_DELAY, (
        f"{rid}: engine produced {len(rows)} rows; the reference's EOC row {got.eoc_row} implies "
        f"{got.eoc_row + 1 + MAX_DELAY}")
    assert result.finish_reason == ("length" if got.eoc_row == max_frames else "stop")
    assert len(result.frames) == got.eoc_row
    # a near-tie (top-2 gap near float noise, ~1e-5 here) would make the comparison meaningless
    free = np.isfinite(got.margins)
    assert got.margins[free].min() > MIN_MARGIN, f"{rid}: near-tie, top-2 margin {got.margins[free].min()}"


def test_steered_masks_were_decisive(runs, references):
    """In the steered model the masks, not the logits, chose: the test would catch a missing mask."""
    ref = references["steered"]
    for rid, text, max_new_tokens, min_new_tokens in STEERED:
        result = runs["steered"]["results"][rid]
        raw = teacher_forced_logits(ref, reference_prompt(ref.tokenizer, text), result.rows).argmax(dim=-1)
        end = max(MIN_FRAMES, min_new_tokens)
        assert (raw[:end, 0] == EOC).all()  # codebook 0 wants to end at once: the min-length rule holds it
        assert result.finish_reason == "stop" and result.rows[end, 0] == EOC and len(result.frames) == end
        assert (raw[1:, 1] == BOC).all()  # codebook 1 always wants BOC: only the masks prevent it
        assert (raw[:, 3] == EOC).all()  # codebook 3 always wants EOC
