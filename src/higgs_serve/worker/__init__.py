"""Stage 0's device side: the step contract (plan in, result out), input staging, attention backends, CUDA graphs, piecewise graphs and launch tapes, the sampler and per-slot audio state."""
