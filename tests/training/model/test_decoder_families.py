"""training.trainer.decoder against transformers, per family: a 2-layer random model of each family (its
distinguishing features on) gives fp32 logits within 1e-4 of the transformers model holding the same weights, on a
sequence longer than the sliding window and on packed documents (each document alone in transformers: positions
restart, and the window applies within each document)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import transformers

from tests.models.tiny import tiny_hf_config
from training.models import registry
from training.trainer.model import decoder, doc_mask

FAMILIES = list(registry.FAMILIES)
TOLERANCE = 1e-4


def _hf_model(family: str, seed: int = 0, **changes) -> torch.nn.Module:
    """The transformers model of the family's tiny config, every weight random (norm weights too, around their
    neutral value, so that a norm applied wrongly shows), fp32, eval mode (eager attention: the reference)."""
    config = transformers.AutoConfig.for_model(**tiny_hf_config(family, **changes))
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn_like(param) * (0.1 if "norm" in name else 0.5)
            param.copy_((param if "norm" in name else 0.0) + noise)
    return model


def _ours(hf: torch.nn.Module) -> decoder.Transformer:
    """Our model of the same config holding the transformers model's weights (fused as the name map says)."""
    config = registry.read_hf_config(hf.config.to_dict())
    model = decoder.build_model(config, use_te=False, te_params_dtype=torch.float32)
    model.to_empty(device="cpu")
    names = registry.family(config.family).names(config)
    state = hf.state_dict()
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(torch.cat([state[part] for part in names.parts(name)]))
    return model.eval()


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request):
    hf = _hf_model(request.param)
    return hf, _ours(hf)


def test_plain_and_past_the_window_logits_equal_transformers(pair):
    hf, ours = pair
    tokens = torch.randint(0, 64, (2, 13), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(tokens).logits
        got = ours.logits(tokens)
    assert (got - expected).abs().max().item() < TOLERANCE
    assert expected.abs().max().item() > 1.0  # not a comparison of near-zero logits


def test_packed_documents_equal_each_document_alone(pair):
    hf, ours = pair
    lengths = [4, 9, 1, 2]  # 9 is past the 5-token window of the windowed families
    tokens = torch.randint(0, 64, (1, sum(lengths)), generator=torch.Generator().manual_seed(2))
    ids = torch.cat([torch.full((n,), i + 1) for i, n in enumerate(lengths)]).unsqueeze(0)
    with torch.no_grad():
        got = ours.logits(tokens, doc_mask.Documents.from_ids(ids))
        pieces = tokens.split(lengths, dim=1)
        expected = torch.cat([hf(piece).logits for piece in pieces], dim=1)
    assert (got - expected).abs().max().item() < TOLERANCE


def test_the_sequence_goes_past_the_window(pair):
    """Where the family has a window, attention without it gives other logits on these tokens: the comparison
    above covers the window."""
    _, ours = pair
    if ours.config.sliding_window is None or "sliding" not in ours.config.layer_types:
        pytest.skip("no sliding-window layer in this family's tiny model")
    full = replace(ours.config, layer_types=("full",) * ours.config.num_layers)
    unwindowed = decoder.Transformer(full, list(ours.layers))
    unwindowed.load_state_dict(ours.state_dict())
    tokens = torch.randint(0, 64, (2, 13), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (unwindowed.logits(tokens) - ours.logits(tokens)).abs().max().item() > 1e-2


def test_loss_and_every_gradient_equal_transformers(pair):
    """The trainer's loss (its chunked head and cross-entropy, chunks smaller than the batch) and the gradient of
    every parameter equal transformers' ``labels=`` loss and its gradients, the fused parameters split back into
    the Hugging Face tensors by the family's name map; a packed batch, so positions restart and windows stay
    within each document. Token 0 is left out: it is Gemma 3's ``pad_token_id``, whose embedding row transformers'
    ``nn.Embedding(padding_idx=0)`` gives no gradient from the input side (the trainer's data holds no padding
    token; a document that did would train that row here)."""
    hf, ours = pair
    names = registry.family(ours.config.family).names(ours.config)
    lengths = [9, 4]
    tokens = torch.randint(1, 64, (1, sum(lengths) + 1), generator=torch.Generator().manual_seed(3))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    ids = torch.cat([torch.full((n,), i + 1) for i, n in enumerate(lengths)]).unsqueeze(0)
    ours.zero_grad(set_to_none=True)
    hf.zero_grad(set_to_none=True)
    ours.loss_chunk_tokens = 4
    try:
        loss = ours(inputs, targets, doc_mask.Documents.from_ids(ids))
    finally:
        ours.loss_chunk_tokens = 0
    loss.backward()
    # transformers' mean over both documents, each alone: the sum of its per-document sums over the token count.
    expected = sum(
        hf(piece).logits.squeeze(0).log_softmax(-1).gather(1, target.T).sum().neg()
        for piece, target in zip(inputs.split(lengths, dim=1), targets.split(lengths, dim=1), strict=True)
    ) / sum(lengths)
    expected.backward()
    assert abs(loss.item() - expected.item()) < TOLERANCE
    theirs = dict(hf.named_parameters())
    checked = 0
    for name, param in ours.named_parameters():
        parts = names.parts(name)
        expected_grad = torch.cat([theirs[part].grad for part in parts])
        assert param.grad is not None, name
        scale = max(expected_grad.abs().max().item(), 1e-3)
        assert (param.grad - expected_grad).abs().max().item() < TOLERANCE * scale * 10, name
        checked += len(parts)
    assert checked == len(theirs)  # every Hugging Face tensor (tied: one matrix) compared
