"""The codec (Stage 1): its config and weights, the decoder and encoder math, the streaming window rule, and the batched runner that decodes many streams' windows in one call on its own thread."""
