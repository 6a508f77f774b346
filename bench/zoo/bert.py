"""One BERT-base encoder layer, written as Hugging Face's ``BertLayer`` (eager attention) writes it.

``transformers/models/bert/modeling_bert.py``: BertSelfAttention (query/key/value Linear layers, heads split by
``view`` + ``permute`` from ``x.size()``, scores divided by sqrt(head size), the additive mask, softmax), then
BertSelfOutput (Linear, residual, LayerNorm), BertIntermediate (Linear, exact erf GELU) and BertOutput (Linear,
residual, LayerNorm). Dropout is kept where Hugging Face has it (it vanishes in eval mode). The mask is the
"extended" one the model computes before its layers: a float bias of shape [batch, 1, 1, seq], 0 where a token
is attended and a large negative number where it is padding.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

HIDDEN = 768
HEADS = 12
INTERMEDIATE = 3072
LN_EPS = 1e-12
SEQ = 128


class BertSelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.head_size = hidden // heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.dropout = nn.Dropout(0.1)

    def transpose_for_scores(self, x: torch.Tensor) -> torch.Tensor:
        # the shape comes from x.size(), as in Hugging Face, so the export carries its Shape arithmetic
        x = x.view(x.size()[:-1] + (self.heads, self.head_size))
        return x.permute(0, 2, 1, 3)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        q = self.transpose_for_scores(self.query(hidden_states))
        k = self.transpose_for_scores(self.key(hidden_states))
        v = self.transpose_for_scores(self.value(hidden_states))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_size)
        probs = self.dropout(F.softmax(scores + attention_mask, dim=-1))
        context = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        return context.view(context.size()[:-2] + (self.heads * self.head_size,))


class BertResidualOutput(nn.Module):
    """BertSelfOutput and BertOutput: the same Linear, dropout, residual add and LayerNorm."""

    def __init__(self, cin: int, hidden: int, eps: float) -> None:
        super().__init__()
        self.dense = nn.Linear(cin, hidden)
        self.dropout = nn.Dropout(0.1)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + input_tensor)


class BertLayer(nn.Module):
    def __init__(self, hidden: int = HIDDEN, heads: int = HEADS, intermediate: int = INTERMEDIATE,
                 eps: float = LN_EPS) -> None:
        super().__init__()
        self.attention = BertSelfAttention(hidden, heads)
        self.attention_output = BertResidualOutput(hidden, hidden, eps)
        self.intermediate = nn.Linear(hidden, intermediate)
        self.output = BertResidualOutput(intermediate, hidden, eps)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        attended = self.attention_output(self.attention(hidden_states, attention_mask), hidden_states)
        inner = F.gelu(self.intermediate(attended))   # approximate="none": the erf form
        return self.output(inner, attended)


def bert_base_layer() -> nn.Module:
    return BertLayer()
