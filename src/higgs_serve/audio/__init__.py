"""Audio in and out of the model's 24 kHz float32: formats and their incremental encoders, decoding clips, resampling, the time stretch, the watermark and its detector, C2PA provenance."""
