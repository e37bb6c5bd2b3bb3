"""A GPT with nanoGPT's architecture in PyTorch, for the "nanogpt_torch" peer (benchmarks/harness/peers.py).

Written for this project following nanoGPT's model structure (no code taken from its repository): token and
learned position embeddings, pre-LayerNorm blocks of causal self-attention (one fused query/key/value
projection, `F.scaled_dot_product_attention(is_causal=True)`) and a GELU MLP of 4x width, a final LayerNorm and
a head tied to the token embedding. Biases everywhere (nanoGPT's `bias=True`, as GPT-2), LayerNorm epsilon
1e-5, no dropout, weights normal(0, 0.02) as nanoGPT initialises them. Imports torch: a benchmark-only extra.

Padding: records shorter than the context are padded at the end, so a causal query at a real position never
sees a padding key; the loss weighs only the real targets (`GPT.loss`).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        return self.proj(y.transpose(1, 2).reshape(batch, length, width))


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.attention_norm = nn.LayerNorm(width, eps=1e-5)
        self.attention = CausalSelfAttention(width, heads)
        self.mlp_norm = nn.LayerNorm(width, eps=1e-5)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class GPT(nn.Module):
    """ids int64 [B, T] -> logits float32 [B, T, vocab_size], T <= context."""

    def __init__(self, vocab_size: int, layers: int, heads: int, width: int, context: int):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab_size, width)
        self.position_embedding = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.final_norm = nn.LayerNorm(width, eps=1e-5)
        self.head = nn.Linear(width, vocab_size, bias=False)
        self.head.weight = self.token_embedding.weight  # tied, as nanoGPT and GPT-2
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.token_embedding(ids) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.final_norm(x))

    def loss(self, ids: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of the next tokens, averaged over the real targets (`mask` 1.0, padding 0.0)."""
        logits = self.forward(ids)
        losses = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
        return (losses * mask.reshape(-1)).sum() / mask.sum()
