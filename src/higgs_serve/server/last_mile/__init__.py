"""Audio out: the engine's chunks turned into the response's bytes (encoders in processes, whole files, SSE, word timestamps, the batch answer)."""
