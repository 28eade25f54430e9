"""PerTh, the watermark's network (network.py), its padded-batch layout (rows.py), its runner
(runner.py, CUDA graphs on a GPU) and the detector's block-by-block score (score.py)."""
