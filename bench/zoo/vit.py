"""ViT-B/16, written as torchvision's ``VisionTransformer`` (``torchvision/models/vision_transformer.py``) writes
it: a 16x16 stride-16 convolution for the patches, a class token and learned position embeddings, 12 encoder
blocks (pre-norm LayerNorm with eps 1e-6, ``nn.MultiheadAttention`` with 12 heads, an MLP of 3072 with exact
GELU, residuals), a final LayerNorm and a Linear head on the class token. 86,567,656 parameters, as
torchvision's ``vit_b_16``. Dropout is kept where torchvision has it (it vanishes in eval mode).
"""
from __future__ import annotations

import torch
from torch import nn

IMAGE = 224
PATCH = 16
HIDDEN = 768
LAYERS = 12
HEADS = 12
MLP = 3072
CLASSES = 1000
LN_EPS = 1e-6


class EncoderBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(HIDDEN, eps=LN_EPS)
        self.self_attention = nn.MultiheadAttention(HIDDEN, HEADS, dropout=0.0, batch_first=True)
        self.dropout = nn.Dropout(0.0)
        self.ln_2 = nn.LayerNorm(HIDDEN, eps=LN_EPS)
        self.mlp = nn.Sequential(nn.Linear(HIDDEN, MLP), nn.GELU(), nn.Dropout(0.0), nn.Linear(MLP, HIDDEN),
                                 nn.Dropout(0.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln_1(x)
        y, _ = self.self_attention(y, y, y, need_weights=False)
        x = x + self.dropout(y)
        return x + self.mlp(self.ln_2(x))


class VisionTransformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv_proj = nn.Conv2d(3, HIDDEN, kernel_size=PATCH, stride=PATCH)
        self.class_token = nn.Parameter(torch.zeros(1, 1, HIDDEN))
        self.pos_embedding = nn.Parameter(torch.empty(1, (IMAGE // PATCH) ** 2 + 1, HIDDEN).normal_(std=0.02))
        self.dropout = nn.Dropout(0.0)
        self.layers = nn.Sequential(*[EncoderBlock() for _ in range(LAYERS)])
        self.ln = nn.LayerNorm(HIDDEN, eps=LN_EPS)
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        x = self.conv_proj(x).reshape(n, HIDDEN, -1).permute(0, 2, 1)
        x = torch.cat([self.class_token.expand(n, -1, -1), x], dim=1)
        x = self.ln(self.layers(self.dropout(x + self.pos_embedding)))
        return self.head(x[:, 0])


def vit_b_16() -> nn.Module:
    # The attention's packed input projection and the position embedding are drawn when built (init_weights
    # leaves them): seeded here, so that every export is the same model.
    torch.manual_seed(0)
    return VisionTransformer()
