"""Gemma 3 text (``Gemma3ForCausalLM``): four (1 + w) RMSNorms per block, query/key norm, GeGLU, scaled embedding,
local sliding-window and global layers with their own RoPE, ``query_pre_attn_scalar``, tied embeddings."""
