"""Issue 3: the prefix cache through the whole engine.

Hits are counted by the KV manager in tokens (`prefix_cache_hits` / `prefix_cache_queries`).
Reused blocks must give the same codes as recomputing them, and eviction under memory pressure
must never hand back stale content.
"""

from __future__ import annotations

import pytest
from engine_harness import TEXTS, ManualEngine, assert_same_output, engine_deploy, sampling, speech

BLOCK = 16  # kv_block_size of the shipped profiles
FRAMES = 10
LONG_TEXT = f"{TEXTS[4]} {TEXTS[7]}"  # a 47-token prompt: 2 full blocks
# eight different prompts of 25 to 58 tokens (1 to 3 full blocks each)
PROMPTS = tuple(f"{TEXTS[i]} {TEXTS[(i + 3) % 8]} {TEXTS[(i + 6) % 8]}" for i in range(8))


def _req(request_id: str, text: str, seed: int = 3):
    return speech(request_id, text, sampling(temperature=0.8, seed=seed, frames=FRAMES))


@pytest.fixture(scope="module")
def reference(tiny_loaded):
    """Every text run alone on an engine without prefix caching and with a roomy pool."""
    eng = ManualEngine(tiny_loaded, engine_deploy(max_num_seqs=4, enable_prefix_caching=False))
    try:
        texts = (*PROMPTS, LONG_TEXT, LONG_TEXT + " Then she sings.")
        out = {text: eng.generate([_req("ref", text)])[0] for text in texts}
        assert eng.kv.prefix_cache_queries == 0  # caching really off
    finally:
        eng.close()
    return out


@pytest.fixture
def cached_engine(tiny_loaded):
    eng = ManualEngine(tiny_loaded, engine_deploy(max_num_seqs=4, max_num_batched_tokens=32))
    yield eng
    eng.close()


def test_identical_prompt_reuses_blocks(cached_engine, reference):
    kv = cached_engine.kv
    (first,) = cached_engine.generate([_req("a", LONG_TEXT)])
    assert kv.prefix_cache_hits == 0
    assert kv.prefix_cache_queries == first.prompt_tokens
    (second,) = cached_engine.generate([_req("b", LONG_TEXT)])
    # every full block except the one holding the last prompt token (its hidden state gives row 0)
    expected_hit_tokens = (first.prompt_tokens - 1) // BLOCK * BLOCK
    assert expected_hit_tokens >= 2 * BLOCK
    assert kv.prefix_cache_hits == expected_hit_tokens
    assert kv.prefix_cache_queries == 2 * first.prompt_tokens
    assert_same_output(first, reference[LONG_TEXT], "first run vs no-cache reference")
    assert_same_output(second, reference[LONG_TEXT], "cache hit vs no-cache reference")
    assert kv.num_free_blocks == kv.num_usable_blocks  # cached-free blocks count as free


def test_shared_prefix_hits_only_common_blocks(cached_engine, reference):
    longer = LONG_TEXT + " Then she sings."
    prompts = cached_engine.core.inputs.prompts
    a, b = prompts.zero_shot(LONG_TEXT), prompts.zero_shot(longer)
    common = 0
    while common < min(len(a), len(b)) and a[common] == b[common]:
        common += 1
    expected = min(common // BLOCK, (len(b) - 1) // BLOCK) * BLOCK
    assert expected >= BLOCK
    cached_engine.generate([_req("a", LONG_TEXT)])
    before = cached_engine.kv.prefix_cache_hits
    (res,) = cached_engine.generate([_req("b", longer)])
    assert cached_engine.kv.prefix_cache_hits - before == expected
    assert_same_output(res, reference[longer], "partial hit")


def test_eviction_under_memory_pressure(tiny_loaded, reference):
    # Worst case per request: prompt (<= 58 tokens) + 10 frames + 7 fed rows <= 5 blocks of 16,
    # so 13 usable blocks hold two requests: the others wait, and cached blocks get evicted.
    eng = ManualEngine(tiny_loaded, engine_deploy(max_num_seqs=8, num_gpu_blocks=14, max_num_batched_tokens=32))
    try:
        kv = eng.kv
        results = eng.generate([_req(f"p{i}", text) for i, text in enumerate(PROMPTS)])
        assert kv.num_evictions > 0
        for text, res in zip(PROMPTS, results):
            assert_same_output(res, reference[text], f"first pass {text!r}")
        # again, in reverse order: whatever survived in the cache is hit, the rest recomputed;
        # either way nothing stale comes back
        hits_before = kv.prefix_cache_hits
        again = eng.generate([_req(f"q{i}", text) for i, text in reversed(list(enumerate(PROMPTS)))])
        for text, res in zip(reversed(PROMPTS), again):
            assert_same_output(res, reference[text], f"second pass {text!r}")
        assert kv.prefix_cache_hits > hits_before
        assert kv.num_free_blocks == kv.num_usable_blocks
        assert eng.core.stats()["num_running"] == 0 and eng.core.stats()["num_waiting"] == 0
    finally:
        eng.close()
