"""Mistral (``MistralForCausalLM``): Llama's block, with an optional sliding window on every layer and an
explicit ``head_dim``."""
