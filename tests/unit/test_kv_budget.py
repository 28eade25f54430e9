"""Per-instance gpu_memory_utilization: other processes' memory does not count against it."""

from higgs_serve.engine.builder import kv_budget_bytes

GIB = 1 << 30


def test_alone_on_the_gpu_gets_its_fraction_less_its_own_usage():
    # 140 GiB device, this engine holds 10 GiB of weights, nothing else runs
    assert kv_budget_bytes(140 * GIB, 130 * GIB, 10 * GIB, 0.5, 3 * GIB) == 57 * GIB


def test_a_second_engine_sharing_the_gpu_gets_the_same_share():
    # the first engine (0.45) already took 63 GiB; the second also asks for 0.45
    total, own, reserve = 140 * GIB, 10 * GIB, 3 * GIB
    first = kv_budget_bytes(total, total - own, own, 0.45, reserve)
    free_for_second = total - (own + first + reserve) - own
    second = kv_budget_bytes(total, free_for_second, own, 0.45, reserve)
    assert second == first == 50 * GIB
    # the old arithmetic (fraction x total - everything used on the device) left it nothing
    assert int(total * 0.45) - (total - free_for_second) - reserve < 0


def test_never_more_than_is_actually_free():
    # fractions summing past 1: the budget stops at the free memory less the reserve
    assert kv_budget_bytes(140 * GIB, 20 * GIB, 10 * GIB, 0.9, 3 * GIB) == 17 * GIB
