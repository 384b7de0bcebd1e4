"""Qwen 3 dense (``Qwen3ForCausalLM``): Llama's block with a per-head RMSNorm on query and key before RoPE and an
explicit ``head_dim``."""
