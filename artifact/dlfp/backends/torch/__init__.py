"""The torch backend: the simulator's scheduler and policies over a real Qwen3 forward pass (GPU or CPU)."""
