import numpy as np
import pytest
import torch

from higgs_serve.worker.sampler import filter_support, random_bits, sample_codes, uniforms

Q = 8


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/unit/conftest.py


def _logits(batch: int, vocab: int, seed: int = 0, scale: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, Q, vocab, generator=g) * scale


def _knobs(batch: int, temperature=1.0, top_k=0, top_p=1.0, seed0=0, row=0):
    return dict(
        temperature=torch.full((batch,), float(temperature)),
        top_k=torch.full((batch,), int(top_k), dtype=torch.int64),
        top_p=torch.full((batch,), float(top_p)),
        seeds=torch.arange(seed0, seed0 + batch, dtype=torch.int64),
        row_index=torch.full((batch,), int(row), dtype=torch.int64),
    )


def _many_draws(logits_one: torch.Tensor, num_seeds: int, **knobs) -> torch.Tensor:
    """logits_one: [Q, V] -> codes [num_seeds, Q] drawn with seeds 0..num_seeds-1."""
    logits = logits_one.expand(num_seeds, *logits_one.shape).contiguous()
    return sample_codes(logits, **_knobs(num_seeds, **knobs))


def _nucleus_reference(logits_row: np.ndarray, top_k: int, top_p: float) -> set[int]:
    """float64 reference: top-k, then the smallest prefix whose cumulative prob >= p."""
    order = np.argsort(-logits_row, kind="stable")
    k = len(order) if top_k <= 0 else min(top_k, len(order))
    kept = order[:k]
    p = np.exp(logits_row[kept] - logits_row[kept].max())
    p /= p.sum()
    cum = np.cumsum(p)
    n = int(np.searchsorted(cum, top_p) + 1) if top_p < 1 else k
    return set(kept[:min(n, k)].tolist())


def test_uniforms_are_in_open_interval_and_look_uniform():
    u = uniforms(torch.arange(4096), torch.arange(4096) * 3, Q)
    assert u.dtype == torch.float32 and u.shape == (4096, Q)
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.005
    hist = torch.histc(u, bins=10, min=0, max=1) / u.numel()
    assert float((hist - 0.1).abs().max()) < 0.006


def test_random_bits_depend_on_every_counter_component():
    seeds = torch.tensor([5, 5, 6, -5])
    rows = torch.tensor([9, 10, 9, 9])
    bits = random_bits(seeds, rows, Q)  # [4, Q]
    assert torch.equal(bits, random_bits(seeds, rows, Q))
    assert torch.unique(bits).numel() == bits.numel()  # seed, row and codebook all matter
    # row r codebook 7 and row r + 1 codebook 0 are distinct counters too
    assert bits[0, 7] != bits[1, 0]


def test_greedy_at_temperature_zero_and_top_k_one():
    logits = _logits(6, 1026, seed=1)
    expected = logits.argmax(-1)
    knobs = _knobs(6, temperature=0.0, top_k=30, top_p=0.8)
    assert torch.equal(sample_codes(logits, **knobs), expected)
    knobs = _knobs(6, temperature=1.5, top_k=1, top_p=1.0)
    assert torch.equal(sample_codes(logits, **knobs), expected)


def test_greedy_respects_mask():
    logits = _logits(3, 50, seed=2)
    top = logits.argmax(-1, keepdim=True)
    allowed = torch.ones_like(logits, dtype=torch.bool).scatter(-1, top, False)
    codes = sample_codes(logits, allowed_mask=allowed, **_knobs(3, temperature=0.0))
    second = logits.masked_fill(~allowed, float("-inf")).argmax(-1)
    assert torch.equal(codes, second)


def test_top_k_support():
    logits_one = _logits(1, 64, seed=3, scale=0.5)[0]  # flat-ish: top-k is what limits it
    codes = _many_draws(logits_one, 400, top_k=5)
    top5 = logits_one.topk(5, dim=-1).indices  # [Q, 5]
    for q in range(Q):
        drawn = set(codes[:, q].tolist())
        assert drawn <= set(top5[q].tolist())
        assert len(drawn) == 5  # all of them show up with 400 draws of a flat distribution


@pytest.mark.parametrize("top_k,top_p", [(0, 0.5), (0, 0.9), (20, 0.7), (3, 0.99), (0, 0.0)])
def test_top_p_support_matches_reference(top_k, top_p):
    logits = _logits(4, 40, seed=4, scale=2.0)
    keep = filter_support(logits, torch.full((4,), top_k), torch.full((4,), top_p))
    for b in range(4):
        for q in range(Q):
            expected = _nucleus_reference(logits[b, q].double().numpy(), top_k, top_p)
            assert set(torch.nonzero(keep[b, q]).flatten().tolist()) == expected


def test_top_p_exact_small_example_and_draws_stay_inside():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits_one = probs.log().expand(Q, 4).contiguous()
    cases = {0.45: {0}, 0.6: {0, 1}, 0.9: {0, 1, 2}, 0.99: {0, 1, 2, 3}}
    for p, support in cases.items():
        keep = filter_support(logits_one[None], torch.zeros(1, dtype=torch.int64),
                              torch.tensor([p]))
        assert set(torch.nonzero(keep[0, 0]).flatten().tolist()) == support
        codes = _many_draws(logits_one, 200, top_p=p)
        assert set(codes.flatten().tolist()) == support


def test_masked_entries_never_drawn():
    g = torch.Generator().manual_seed(5)
    logits = _logits(16, 1026, seed=5)
    allowed = torch.rand(16, Q, 1026, generator=g) < 0.3
    allowed[..., 7] = True  # at least one allowed entry everywhere
    logits = torch.where(allowed, logits, 1e4)  # forbidden entries look like the best ones
    for knobs in (dict(), dict(top_k=30, top_p=0.8, temperature=0.8), dict(temperature=0.0),
                  dict(top_k=1), dict(top_p=0.0)):
        codes = sample_codes(logits, allowed_mask=allowed, **_knobs(16, **knobs))
        assert allowed.gather(-1, codes[..., None]).all()


def test_additive_bias_equals_bool_mask():
    logits = _logits(5, 100, seed=6)
    allowed = torch.rand(5, Q, 100, generator=torch.Generator().manual_seed(6)) < 0.5
    allowed[..., 0] = True
    bias = torch.zeros(5, Q, 100).masked_fill(~allowed, float("-inf"))
    knobs = _knobs(5, temperature=0.9, top_k=10, top_p=0.9)
    assert torch.equal(sample_codes(logits, allowed_mask=allowed, **knobs),
                       sample_codes(logits, allowed_mask=bias, **knobs))


def test_seed_reproducibility_and_row_dependence():
    logits = _logits(4, 1026, seed=7, scale=1.0)
    knobs = _knobs(4, temperature=1.0, seed0=100, row=3)
    a = sample_codes(logits, **knobs)
    assert torch.equal(a, sample_codes(logits, **knobs))
    other_seed = dict(knobs, seeds=knobs["seeds"] + 1000)
    other_row = dict(knobs, row_index=knobs["row_index"] + 1)
    assert (a != sample_codes(logits, **other_seed)).float().mean() > 0.8
    assert (a != sample_codes(logits, **other_row)).float().mean() > 0.8


def test_batch_position_independence():
    g = torch.Generator().manual_seed(8)
    mine_logits = torch.randn(1, Q, 1026, generator=g)
    mine = dict(temperature=torch.tensor([0.8]), top_k=torch.tensor([30]),
                top_p=torch.tensor([0.8]), seeds=torch.tensor([424242]),
                row_index=torch.tensor([17]))
    alone = sample_codes(mine_logits, **mine)
    for pos in (0, 5):
        logits = torch.randn(9, Q, 1026, generator=g) * 2
        knobs = dict(temperature=torch.rand(9, generator=g) + 0.3,
                     top_k=torch.randint(0, 60, (9,), generator=g),
                     top_p=torch.rand(9, generator=g),
                     seeds=torch.randint(0, 1 << 40, (9,), generator=g),
                     row_index=torch.randint(0, 500, (9,), generator=g))
        logits[pos] = mine_logits[0]
        for name, value in mine.items():
            knobs[name] = knobs[name].to(value.dtype)
            knobs[name][pos] = value[0]
        assert torch.equal(sample_codes(logits, **knobs)[pos], alone[0])


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 4, 1.0), (0.9, 5, 0.8)])
def test_empirical_distribution_matches_filtered_softmax(temperature, top_k, top_p):
    logits_one = torch.tensor([1.0, 0.2, -0.5, 0.7, -1.5, 0.0]).expand(Q, 6).contiguous()
    n_seeds = 2500
    codes = _many_draws(logits_one, n_seeds, temperature=temperature, top_k=top_k, top_p=top_p)
    counts = torch.bincount(codes.flatten(), minlength=6).double()
    scaled = logits_one[0].double() / temperature
    support = _nucleus_reference(scaled.numpy(), top_k, top_p)
    outside = torch.tensor([i not in support for i in range(6)])
    expected = torch.softmax(scaled.masked_fill(outside, float("-inf")), -1) * codes.numel()
    assert (counts[outside] == 0).all()
    keep = ~outside
    chi2 = float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    assert chi2 < 20.5  # chi-square, <= 5 dof, p = 0.001


def test_shape_errors_name_the_argument():
    logits = _logits(2, 10)
    knobs = _knobs(2)
    with pytest.raises(ValueError, match="top_p"):
        sample_codes(logits, **dict(knobs, top_p=torch.ones(3)))
    with pytest.raises(ValueError, match="allowed_mask"):
        sample_codes(logits, allowed_mask=torch.ones(2, Q, 9, dtype=torch.bool), **knobs)
