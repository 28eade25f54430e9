"""Shared Triton launch helpers: the cached launcher (`launcher`) and programmatic dependent
launch (`pdl`). Used by model/, codec/ and worker/; imports none of them (the lowest layer that
knows about kernels)."""
