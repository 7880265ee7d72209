"""Hugging Face BertForSequenceClassification (random weights) example."""

import torch
import torch.nn.functional as F
import transformers
from torch import nn
from transformers import BertConfig, BertForSequenceClassification

transformers.logging.set_verbosity_error()

BATCH_SIZE = 8
SEQ_LEN = 16
VOCAB_SIZE = 128
NUM_LABELS = 3


def build_bert(
    num_hidden_layers: int = 2,
    hidden_size: int = 64,
    num_attention_heads: int = 4,
    intermediate_size: int = 128,
    vocab_size: int = VOCAB_SIZE,
) -> nn.Module:
    """Build a randomly initialised BertForSequenceClassification, in train mode."""
    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        classifier_dropout=0.0,
        num_labels=NUM_LABELS,
        pad_token_id=0,
        use_cache=False,
    )
    torch.manual_seed(0)
    model = BertForSequenceClassification(config)
    model.train()
    return model


def build_model() -> nn.Module:
    """Build the default small BERT classifier (2 layers, hidden 64)."""
    return build_bert()


def example_inputs() -> dict[str, torch.Tensor]:
    """Return ``input_ids`` and ``attention_mask``, both (8, 16) int64.

    Every other sequence is right-padded (mask zeros, pad token id 0).
    """
    g = torch.Generator().manual_seed(1234)
    input_ids = torch.randint(1, VOCAB_SIZE, (BATCH_SIZE, SEQ_LEN), generator=g)
    lengths = torch.tensor([SEQ_LEN, 12, SEQ_LEN, 9, SEQ_LEN, 14, SEQ_LEN, 5])
    attention_mask = (torch.arange(SEQ_LEN)[None, :] < lengths[:, None]).long()
    input_ids = input_ids * attention_mask
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def example_targets() -> tuple[torch.Tensor, ...]:
    """Return deterministic (8,) int64 class labels in [0, 3)."""
    g = torch.Generator().manual_seed(5678)
    return (torch.randint(0, NUM_LABELS, (BATCH_SIZE,), generator=g),)


def loss_fn(output: transformers.utils.ModelOutput, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy on ``output.logits``, mean-reduced over the batch."""
    return F.cross_entropy(output.logits, target, reduction="mean")


if __name__ == "__main__":
    _model = build_model()
    print(loss_fn(_model(**example_inputs()), *example_targets()).item())
