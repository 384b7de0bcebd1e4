"""Qwen 2 / 2.5 (``Qwen2ForCausalLM``): Llama's block with a bias on the query, key and value projections."""
