"""KVCacheManager: reservation, lazy growth, prefix cache by content key, LRU eviction."""

import pytest

from higgs_serve.engine.kv_cache_manager import NULL_BLOCK, KVCacheManager, compute_block_keys
from higgs_serve.engine.request import Request

BS = 4  # block size used throughout


def make_request(request_id, prompt, max_frames=1, **kwargs):
    prompt = tuple(prompt)
    return Request(request_id, prompt, sampling=None, max_frames=max_frames, min_frames=0, **kwargs)


def admit(kv, request, num_tokens=None, reserve_tokens=None):
    """Look up hits, allocate, and return the table (or None)."""
    request.block_keys = kv.block_keys(request)
    hits, _ = kv.get_computed_blocks(request)
    num_tokens = request.num_prompt_tokens if num_tokens is None else num_tokens
    reserve = request.max_num_tokens if reserve_tokens is None else reserve_tokens
    return kv.allocate(request, hits, num_tokens, reserve)


def compute_prompt(kv, request):
    kv.cache_blocks(request, request.num_prompt_tokens)


def admit_computed(kv, request, **kwargs):
    """`admit`, then compute (and so publish) the whole prompt; returns the table."""
    table = admit(kv, request, **kwargs)
    compute_prompt(kv, request)
    return table


def keyed_request(kv, request_id, prompt, **kwargs):
    """A request with its content keys computed, ready for `kv.get_computed_blocks`."""
    request = make_request(request_id, prompt, **kwargs)
    request.block_keys = kv.block_keys(request)
    return request


# ----- content keys
def test_block_keys_depend_on_tokens_and_parent_only_for_full_blocks():
    a = compute_block_keys(tuple(range(10)), BS)
    b = compute_block_keys(tuple(range(8)) + (99, 98), BS)
    assert len(a) == 2  # the partial third block is not keyed
    assert a == b
    c = compute_block_keys((7,) + tuple(range(1, 10)), BS)
    assert c[0] != a[0] and c[1] != a[1]  # a changed parent changes every child key


def test_placeholder_key_separates_voices_only_from_the_overlapping_block_on():
    prompt = tuple(range(16))  # P span = positions 5..8 → blocks 1 and 2 overlap it
    voice_a = compute_block_keys(prompt, BS, "voice-a", 5, 4)
    voice_b = compute_block_keys(prompt, BS, "voice-b", 5, 4)
    plain = compute_block_keys(prompt, BS)
    assert voice_a[0] == voice_b[0] == plain[0]
    assert all(x != y for x, y in zip(voice_a[1:], voice_b[1:]))
    assert voice_a[1] != plain[1]
    assert compute_block_keys(prompt, BS, "voice-a", 5, 4) == voice_a  # deterministic


def test_placeholder_without_key_is_not_cacheable():
    keys = compute_block_keys(tuple(range(16)), BS, None, 5, 4)
    assert len(keys) == 1  # block 0 only; block 1 overlaps an unknown span and stops the chain


# ----- allocation and reservation
def test_allocate_reserves_worst_case_and_grows_lazily():
    kv = KVCacheManager(num_blocks=21, block_size=BS, enable_prefix_caching=False)
    assert kv.num_free_blocks == 20  # block 0 is the null block
    req = make_request("a", range(6), max_frames=5)  # worst case 6 + 5 + 7 = 18 tokens = 5 blocks
    table = admit(kv, req)
    assert table == (1, 2)  # covers the 6 prompt tokens
    assert NULL_BLOCK not in table
    assert kv.num_free_blocks == 15  # 2 taken + 3 still reserved
    assert kv.allocate_slots("a", 8) == (1, 2)
    assert kv.allocate_slots("a", 9) == (1, 2, 3)
    assert kv.num_free_blocks == 15  # growth comes out of the reservation
    kv.free("a")
    assert kv.num_free_blocks == 20


def test_allocate_returns_none_without_side_effects_and_fits_exactly():
    kv = KVCacheManager(num_blocks=9, block_size=BS, enable_prefix_caching=False)
    assert admit(kv, make_request("a", range(4), max_frames=13)) is not None  # 24 tokens = 6 blocks
    assert kv.num_free_blocks == 2
    assert not kv.can_allocate(3) and kv.can_allocate(2)
    assert admit(kv, make_request("b", range(4), max_frames=5)) is None  # 16 tokens = 4 blocks
    assert kv.num_free_blocks == 2  # nothing changed
    # a has taken only block 1 so far (lazy growth); c gets block 2 and reserves one more
    assert admit(kv, make_request("c", range(4)), reserve_tokens=8) == (2,)
    assert kv.num_free_blocks == 0
    kv.free("a")
    assert kv.num_free_blocks == 6


def test_growth_past_the_reservation_uses_only_unreserved_blocks():
    kv = KVCacheManager(num_blocks=5, block_size=BS, enable_prefix_caching=False)
    assert admit(kv, make_request("a", range(4)), reserve_tokens=4) == (1,)
    assert admit(kv, make_request("b", range(4)), reserve_tokens=12) == (2,)  # reserves 2 more
    assert kv.num_free_blocks == 0
    assert kv.allocate_slots("a", 5) is None  # the free blocks are promised to b
    assert kv.allocate_slots("b", 12) == (2, 3, 4)


# ----- prefix cache
def test_identical_prompt_reuses_full_blocks_and_counts_tokens():
    kv = KVCacheManager(num_blocks=33, block_size=BS, enable_prefix_caching=True)
    first = make_request("a", range(10))
    table_a = admit_computed(kv, first)
    assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (10, 0)
    second = keyed_request(kv, "b", range(10))
    hits, num_hit_tokens = kv.get_computed_blocks(second)
    assert hits == table_a[:2] and num_hit_tokens == 8
    table_b = kv.allocate(second, hits, 10, second.max_num_tokens)
    assert table_b[:2] == table_a[:2] and table_b[2] != table_a[2]  # partial block is private
    assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (20, 8)


def test_hit_always_leaves_the_last_prompt_token_to_compute():
    kv = KVCacheManager(num_blocks=33, block_size=BS, enable_prefix_caching=True)
    first = make_request("a", range(8))  # exactly two full blocks
    admit_computed(kv, first)
    second = keyed_request(kv, "b", range(8))
    assert kv.get_computed_blocks(second)[1] == 4  # not 8: the last token's hidden gives row 0


def test_blocks_are_published_only_once_computed():
    kv = KVCacheManager(num_blocks=33, block_size=BS, enable_prefix_caching=True)
    first = make_request("a", range(12))
    admit(kv, first, num_tokens=5)
    kv.cache_blocks(first, 5)  # first chunk computed 5 tokens: one full block
    second = keyed_request(kv, "b", range(12))
    assert kv.get_computed_blocks(second)[1] == 4


def test_different_voices_do_not_share_placeholder_blocks():
    kv = KVCacheManager(num_blocks=33, block_size=BS, enable_prefix_caching=True)
    prompt = tuple(range(16))
    span = dict(placeholder_start=5, num_placeholders=4)
    first = make_request("a", prompt, placeholder_key="voice-a", **span)
    admit_computed(kv, first)
    other = keyed_request(kv, "b", prompt, placeholder_key="voice-b", **span)
    assert kv.get_computed_blocks(other)[1] == 4  # only the block before the P span
    same = keyed_request(kv, "c", prompt, placeholder_key="voice-a", **span)
    assert kv.get_computed_blocks(same)[1] == 12


def test_freed_cached_blocks_are_hits_until_evicted_and_never_stale():
    kv = KVCacheManager(num_blocks=9, block_size=BS, enable_prefix_caching=True)
    first = make_request("a", range(9))
    table_a = admit_computed(kv, first, reserve_tokens=9)  # 3 blocks
    kv.free("a")
    assert kv.num_free_blocks == 8  # cached blocks still count as free
    again = keyed_request(kv, "b", range(9))
    assert kv.get_computed_blocks(again)[0] == table_a[:2]
    # Pressure: a different prompt takes every block; plain blocks go first, then LRU cached ones.
    hog = make_request("c", range(100, 132))
    assert admit(kv, hog, reserve_tokens=32) is not None  # 8 blocks
    assert kv.num_evictions == 2  # the two keyed blocks; the partial third block was plain
    assert kv.get_computed_blocks(again) == ((), 0)  # evicted content is never a hit
    kv.free("c")


def test_plain_free_blocks_are_used_before_cached_ones():
    kv = KVCacheManager(num_blocks=9, block_size=BS, enable_prefix_caching=True)
    first = make_request("a", range(9))
    admit_computed(kv, first, reserve_tokens=9)
    kv.free("a")
    other = make_request("b", range(50, 70))
    admit(kv, other, reserve_tokens=20)  # 5 blocks: exactly the plain free ones
    assert kv.num_evictions == 0
    again = keyed_request(kv, "c", range(9))
    assert kv.get_computed_blocks(again)[1] == 8


def test_lru_evicts_least_recently_freed_and_deepest_block_first():
    kv = KVCacheManager(num_blocks=7, block_size=BS, enable_prefix_caching=True)
    old = make_request("old", range(9))  # keys 2 blocks
    admit_computed(kv, old, reserve_tokens=9)
    new = make_request("new", range(200, 209))
    admit_computed(kv, new, reserve_tokens=9)
    kv.free("old")
    kv.free("new")
    # 4 cached blocks + 2 plain; taking 3 blocks evicts one: old's deepest block.
    assert admit(kv, make_request("x", range(300, 312)), reserve_tokens=12) is not None
    assert kv.num_evictions == 1
    probe_old = keyed_request(kv, "p", range(9))
    probe_new = keyed_request(kv, "q", range(200, 209))
    assert kv.get_computed_blocks(probe_old)[1] == 4  # root survives, child evicted
    assert kv.get_computed_blocks(probe_new)[1] == 8


def test_shared_blocks_in_use_are_never_evicted():
    kv = KVCacheManager(num_blocks=9, block_size=BS, enable_prefix_caching=True)
    first = make_request("a", range(9))
    admit_computed(kv, first, reserve_tokens=12)  # 3 blocks
    sharer = keyed_request(kv, "b", range(9))
    hits, _ = kv.get_computed_blocks(sharer)
    assert kv.allocate(sharer, hits, 9, 12) is not None  # shares 2, takes 1
    kv.free("a")  # shared blocks stay referenced by b; a's private block becomes free (uncached)
    assert kv.num_free_blocks == 5
    assert admit(kv, make_request("c", range(100, 120)), reserve_tokens=20) is not None  # 5 blocks
    assert kv.num_free_blocks == 0 and kv.num_evictions == 0
    assert kv.block_table("b")[:2] == hits
    probe = keyed_request(kv, "p", range(9))
    assert kv.get_computed_blocks(probe)[0] == hits  # still cached and still correct


def test_shared_hit_on_a_free_cached_block_counts_against_capacity():
    kv = KVCacheManager(num_blocks=4, block_size=BS, enable_prefix_caching=True)
    first = make_request("a", range(9))
    admit_computed(kv, first, reserve_tokens=12)
    kv.free("a")
    second = keyed_request(kv, "b", range(9))
    hits, _ = kv.get_computed_blocks(second)
    assert kv.allocate(second, hits, 9, 16) is None  # 2 revived + 2 new > 3 free
    assert kv.allocate(second, hits, 9, 12) is not None
    assert kv.num_free_blocks == 0


def test_concurrent_identical_prompts_keep_one_cache_entry():
    kv = KVCacheManager(num_blocks=33, block_size=BS, enable_prefix_caching=True)
    a, b = make_request("a", range(9)), make_request("b", range(9))
    table_a, table_b = admit(kv, a), admit(kv, b)  # both admitted before either is computed
    compute_prompt(kv, a)
    compute_prompt(kv, b)  # b's blocks stay private
    kv.free("b")
    kv.free("a")
    probe = keyed_request(kv, "p", range(9))
    assert kv.get_computed_blocks(probe)[0] == table_a[:2]
    assert table_b[0] != table_a[0]


def test_prefix_caching_disabled_never_hits_or_counts():
    kv = KVCacheManager(num_blocks=33, block_size=BS, enable_prefix_caching=False)
    first = make_request("a", range(9))
    admit_computed(kv, first)
    kv.free("a")
    again = make_request("b", range(9))
    assert admit(kv, again) is not None
    assert again.block_keys == ()
    assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (0, 0)


def test_rejects_a_pool_without_usable_blocks():
    with pytest.raises(ValueError, match="num_blocks"):
        KVCacheManager(num_blocks=1, block_size=BS, enable_prefix_caching=False)
