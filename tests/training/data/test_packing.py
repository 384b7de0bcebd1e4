"""Packing conversations (training.trainer.data.packing, doc_mask): best-fit decreasing windows, per-document positions
and masks, Transformer Engine's packed format (a stand-in TE layer), and on 2 gloo ranks: packed logits equal each
example alone, and the step's gradient equals one process's mean over every trained token."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.training.chat_models import model_folder
from tests.training.llama import llama
from tests.training.runner import ROOT, cli_args, env
from training.contract import settings_table
from training.prepare import chat
from training.trainer.data import packing, token_files
from training.trainer.loss import IGNORE_INDEX
from training.trainer.model import decoder, doc_mask, rotary


def test_best_fit_decreasing_places_every_example_once_and_fills_windows():
    lengths = np.array([5, 9, 3, 12, 30, 7, 7, 7, 2, 20, 16, 1])
    windows = packing.best_fit_decreasing(lengths, 32)
    assert sorted(i for window in windows for i in window) == list(range(len(lengths)))
    assert all(sum(lengths[w]) <= 32 for w in windows)
    assert len(windows) == -(-int(lengths.sum()) // 32)  # 119 tokens: 4 windows, the fewest possible
    # longest first, each into the fullest window that still has room: 30 alone until 2 fills it
    assert [list(lengths[w]) for w in windows][0] == [30, 2]
    assert packing.best_fit_decreasing(np.array([32, 32]), 32) == [[0], [1]]


def test_positions_mask_and_te_arguments_of_a_packed_row():
    ids = torch.tensor([[1, 1, 1, 2, 2, 0, 0], [1, 1, 1, 1, 1, 1, 1]])
    assert doc_mask.positions(ids).tolist() == [[0, 1, 2, 0, 1, 0, 1], [0, 1, 2, 3, 4, 5, 6]]
    mask = doc_mask.block_causal_mask(ids)[0, 0]
    assert mask[4].tolist() == [False, False, False, True, True, False, False]  # its own document, causal
    assert mask[2].tolist() == [True, True, True, False, False, False, False]
    cu_seqlens, longest = doc_mask.te_arguments(ids.numpy())
    assert cu_seqlens.tolist() == [0, 3, 5, 7, 14] and cu_seqlens.dtype == np.int32 and longest == 7


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("packing")
    folder = model_folder(tmp / "model", "qwen2.5")
    lines = [{"prompt": str(n) * (1 + n % 5), "completion": str(n + 1)} for n in range(40)]
    (tmp / "chats.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    chat.prepare_chat([tmp / "chats.jsonl"], str(tmp / "data"), str(folder), validation_fraction=0.1)
    return tmp / "data"


def test_a_window_trains_exactly_the_marked_tokens_of_each_of_its_examples(prepared):
    tokens, mask, offsets = packing.read_split(prepared, "train", "uint16")
    data = packing.Conversations(prepared, "train", token_dtype="uint16", seq_length=512, batch_size=2, seed=0,
                                 rank=0, world_size=1)  # fmt: skip
    assert len(data.windows) <= -(-int(offsets[-1]) // 512) + 1  # 36 examples of about 100 tokens, 5 a window
    for index in range(len(data.windows)):
        row, targets, ids = data.window(index)
        at = 0
        for number, example in enumerate(data.windows[index], 1):
            begin, end = offsets[example], offsets[example + 1]
            assert (row[at : at + end - begin] == tokens[begin:end]).all() and (
                ids[at : at + end - begin] == number
            ).all()
            expected = np.where(
                mask[begin + 1 : end] == 1, tokens[begin + 1 : end].astype(np.int64), IGNORE_INDEX
            )
            assert (targets[at : at + end - begin - 1] == expected).all() and targets[
                at + end - begin - 1
            ] == IGNORE_INDEX
            at += end - begin
        assert (ids[at:] == 0).all() and (targets[at:] == IGNORE_INDEX).all()
    padded = packing.Conversations(prepared, "train", token_dtype="uint16", seq_length=512, batch_size=2, seed=0,
                                   rank=0, world_size=1, packing=False)  # fmt: skip
    assert len(padded.windows) == 36 and padded.trained_per_window() * 36 == data.trained_per_window() * len(
        data.windows
    )


def test_an_example_longer_than_seq_length_and_too_few_windows_are_refused(prepared):
    with pytest.raises(settings_table.ContractError, match=r"seq_length: the longest example of the train split has \d+ "
                       r"tokens .* raise seq_length, or prepare the data again with --max-tokens 32"):  # fmt: skip
        packing.Conversations(prepared, "train", token_dtype="uint16", seq_length=32, batch_size=1, seed=0, rank=0,
                              world_size=1)  # fmt: skip
    with pytest.raises(
        settings_table.ContractError, match="batch_size: the validation split .* makes 1 windows"
    ):
        packing.Conversations(prepared, "validation", token_dtype="uint16", seq_length=1024, batch_size=2, seed=0,
                              rank=0, world_size=1)  # fmt: skip


def test_the_data_check_of_conversations_counts_grad_accum_steps_and_names_the_product(prepared):
    """One optimizer step reads batch_size x grad_accum_steps windows on every process, as for token files."""
    settings = dict(token_dtype="uint16", seq_length=512, batch_size=1, seed=0, packing=True, init_from=None)
    assert "conversations: 36 training examples" in packing.check(
        types.SimpleNamespace(**settings, grad_accum_steps=1), str(prepared), 1
    )
    with pytest.raises(settings_table.ContractError) as info:  # about 8 windows: not 16
        packing.check(types.SimpleNamespace(**settings, grad_accum_steps=16), str(prepared), 1)
    assert str(info.value).startswith(f"batch_size: the train split in {prepared} makes ")
    assert str(info.value).endswith(
        "; one optimizer step (batch_size 1 x grad_accum_steps 16 x 1 processes) needs 16: lower batch_size, "
        "grad_accum_steps or seq_length, or add data"
    )


@pytest.mark.parametrize("packed", [True, False])
def test_a_token_id_not_below_the_vocabulary_is_named_by_file_and_position_when_its_batch_is_read_ahead(
    prepared, packed
):
    """The trainer reads each batch a step ahead (``check_next``, kept for the step that uses it): conversations,
    packed or padded, refuse an id not below ``vocab_size`` there, naming the token file and the position."""
    tokens = packing.read_split(prepared, "train", "uint16")[0]
    peak = int(tokens.max())

    def reader(vocab_size: int | None) -> packing.Conversations:
        return packing.Conversations(prepared, "train", token_dtype="uint16", seq_length=512, batch_size=2, seed=0,
                                     rank=0, world_size=1, packing=packed, vocab_size=vocab_size)  # fmt: skip

    checked, reference = reader(peak), reader(None)
    found = None
    for _ in range(len(checked.windows)):  # an epoch: every window once
        found = checked.check_next()
        if found is not None:
            break
        batch, expected = checked.next_batch(), reference.next_batch()
        assert all(torch.equal(a, b) for a, b in zip(batch, expected, strict=True))
    assert found is not None
    match = re.fullmatch(
        rf"vocab_size: must be above every token id in the data; {re.escape(str(prepared / 'train.bin'))} holds "
        rf"id {peak} \(token (\d+)\), got {peak}",
        found,
    )
    assert match and int(tokens[int(match.group(1))]) == peak, found
    assert reader(peak + 1).check_next() is None


class _FakeTELayer(torch.nn.Module):
    """Stands in for ``transformer_engine.pytorch.TransformerLayer`` (TE cannot run here): records its arguments and
    computes what TE 2.11 computes for ``thd`` input: attention within each sequence ``cu_seqlens`` delimits, RoPE
    restarting per sequence, by running a torch block on each sequence alone."""

    built: list[dict] = []
    calls: list[dict] = []

    def __init__(self, **kwargs):
        super().__init__()
        _FakeTELayer.built.append(kwargs)
        shape = llama(1, kwargs["hidden_size"], kwargs["num_attention_heads"], kwargs["ffn_hidden_size"], 8,
                      kwargs["num_gqa_groups"])  # fmt: skip
        self.inner = decoder.TorchBlock(shape)

    def forward(self, x, rotary_pos_emb=None, cu_seqlens_q=None, max_seqlen_q=None):
        _FakeTELayer.calls.append(
            {"shape": tuple(x.shape), "cu_seqlens": cu_seqlens_q, "max_seqlen": max_seqlen_q}
        )
        assert x.dim() == 2 and cu_seqlens_q.dtype == torch.int32 and isinstance(max_seqlen_q, int)
        bounds = cu_seqlens_q.tolist()
        pieces = [
            self.inner(x[a:b].unsqueeze(0), rotary_pos_emb)[0]
            for a, b in zip(bounds[:-1], bounds[1:], strict=True)
        ]
        return torch.cat(pieces)


def test_the_transformer_engine_path_gets_thd_cu_seqlens_and_gives_the_torch_paths_logits(monkeypatch):
    te = types.ModuleType("transformer_engine.pytorch")
    te.TransformerLayer = _FakeTELayer
    monkeypatch.setitem(sys.modules, "transformer_engine", types.ModuleType("transformer_engine"))
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch", te)
    shape = llama(2, 64, 4, 128, 96, 2)
    rope = rotary.Rope(shape.head_dim, 10000.0)
    torch.manual_seed(0)
    reference = decoder.Transformer(shape, [decoder.TorchBlock(shape) for _ in range(2)], rope=rope)
    packed = decoder.Transformer(
        shape, [decoder.te_block(shape, i + 1, torch.float32, packed=True) for i in range(2)], rope=rope
    )
    packed.te_packed = True
    assert all(
        kw["attn_input_format"] == "thd" and kw["self_attn_mask_type"] == "padding_causal"
        for kw in _FakeTELayer.built[-2:]
    )
    with torch.no_grad():
        packed.embed.weight.copy_(reference.embed.weight)
        packed.head.weight.copy_(reference.head.weight)
        for fake, block in zip(packed.layers, reference.layers, strict=True):
            fake.inner.load_state_dict(block.state_dict())
    ids = torch.tensor([[1] * 5 + [2] * 9 + [0] * 2, [1] * 16])
    tokens = torch.randint(0, 96, ids.shape, generator=torch.Generator().manual_seed(1))
    documents = doc_mask.Documents.from_ids(ids)
    with torch.no_grad():
        got, expected = packed.logits(tokens, documents), reference.logits(tokens, documents)
    assert (
        _FakeTELayer.calls[-1]["cu_seqlens"].tolist() == [0, 5, 14, 16, 32]
        and _FakeTELayer.calls[-1]["max_seqlen"] == 16
    )
    assert _FakeTELayer.calls[-1]["shape"] == (32, 64)  # the batch's tokens as one stream
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="built for packed documents: pass documents"):
        packed.logits(tokens)


PROBE = {"model_preset": "custom", "num_layers": "2", "hidden_size": "64", "num_heads": "4", "num_kv_heads": "2",
         "ffn_hidden_size": "128", "vocab_size": "256", "seq_length": "32", "batch_size": "2", "precision": "fp32",
         "deterministic": "true"}  # fmt: skip


@pytest.mark.slow
def test_on_two_ranks_packed_logits_equal_alone_and_the_gradient_is_the_mean_over_every_trained_token(
    tmp_path,
):
    out = tmp_path / "probe.pt"
    command = ["torchrun", "--standalone", "--nproc-per-node=2",
               str(Path(__file__).parent.with_name("sft_probe.py")), str(out), *cli_args(PROBE)]  # fmt: skip
    proc = subprocess.run(command, env=env(), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = torch.load(out)
    print(f"packed vs alone logits: {result['logits_diff']:.2e}; gradient vs reference: {result['grad_diff']:.2e}; "
          f"naive per-micro-batch mean: {result['naive_diff']:.2e}")  # fmt: skip
    assert result["logits_diff"] <= 1e-5
    assert result["grad_diff"] <= 1e-6
    assert result["naive_diff"] > 1e-4  # the mean of micro-batch means would fail this test
    # unequal counts: rank 0's micro-batches weigh 1.18 and 0.23 of a per-token mean, rank 1's first none at all
    assert result["empty"] == 1 and result["shares"][1] < 0.5 < result["shares"][0]


def test_validation_scores_every_window_once_the_last_batch_filled_with_windows_that_count_nothing(prepared):
    """Issue 53 item 20: the windows that do not fill a whole global batch were left out (56 of 59 scored); now the
    last batch is filled up with padding windows (no target counted), and every trained target is scored once."""
    _, mask, offsets = packing.read_split(prepared, "train", "uint16")
    ranks = [packing.Conversations(prepared, "train", token_dtype="uint16", seq_length=512, batch_size=5, seed=0,
                                   rank=r, world_size=2, packing=False, shuffle=False) for r in range(2)]  # fmt: skip
    assert len(ranks[0].windows) == 36  # 3 global batches of 10 and 6 more
    batches = [data.validation_batches(100) for data in ranks]
    assert [len(b) for b in batches] == [4, 4]  # every rank the same number (a collective)
    counted = sum(int((batch[1] != IGNORE_INDEX).sum()) for share in batches for batch in share)
    assert counted == int(mask.sum())  # each example's trained targets (its first token is never one)
    last = batches[1][-1]  # rank 1's share of the last global batch: window 35, then 4 of padding
    assert (last[1][1:] == IGNORE_INDEX).all() and (last[2][1:] == 0).all() and (last[0][1:] == 0).all()
    assert len(batches[0][0]) == 3 and (batches[0][0][1] != IGNORE_INDEX).any(axis=1).all()
    assert token_files.validation_note(36, 2, 5, 2) == (
        "validation: scores 20 of the split's 36 windows each time (validation_batches 2 x batch_size 5 x 2 "
        "processes); raise validation_batches to 4 to score them all"
    )
    assert token_files.validation_note(36, 4, 5, 2) is None


def test_validation_of_token_files_scores_every_window_once(tmp_path):
    tokens = np.arange(7 * 9, dtype=np.uint16) % 50  # 7 windows of seq_length 8 + 1
    tokens.tofile(tmp_path / "validation.bin")
    ranks = [token_files.TokenFiles([tmp_path / "validation.bin"], "uint16", 50, 8, 2, 0, r, 2, shuffle=False)
             for r in range(2)]  # fmt: skip
    batches = [data.validation_batches(10) for data in ranks]
    assert [len(b) for b in batches] == [2, 2]
    targets = sorted(
        int(t) for share in batches for batch in share for t in batch[1].flatten() if t != IGNORE_INDEX
    )
    expected = sorted(int(t) for w in range(7) for t in tokens[w * 9 + 1 : (w + 1) * 9])
    assert targets == expected
