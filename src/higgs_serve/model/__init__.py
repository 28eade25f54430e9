"""The model as pure math and format: the HF config, checkpoint loading, the prompt, the delay pattern, the Qwen3 talker and its fused ops, and the tiny checkpoint writer."""
