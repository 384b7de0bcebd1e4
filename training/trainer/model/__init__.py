"""The model: the decoder (``decoder``: embedding, blocks, final norm, LM head and loss), its attention kernels
(``attention``), rotary embeddings (``rotary``), packed documents' block-causal mask (``doc_mask``), LoRA adapters
(``lora``) and the Hugging Face names of its weights, any family (``layout``)."""
