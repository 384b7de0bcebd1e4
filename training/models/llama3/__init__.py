"""Llama 3 (``LlamaForCausalLM``): Meta's Llama 3.1 / 3.2 and the Llama-style named sizes."""
