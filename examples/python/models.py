"""Models for the Python examples and tests, in plain torch.

CharMLP is the demo's character model (examples/demo_trainer.c) written in
torch: the previous ctx characters through an embedding table, tanh hidden
layers, a head over 27 symbols (a-z and '.', the word boundary).
TinyTransformer is a small causal transformer over the same symbols. Both
name their parameters as configs/muon.lua expects: embed.*, hidden.* or
blocks.*, head.*.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

V = 27  # a-z and '.'


def words(path="/usr/share/dict/words"):
    """The lowercase a-z words of the Debian word list (package wamerican)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        ws = [w.strip() for w in f]
    return [w for w in ws if w and w.isascii() and w.isalpha() and w.islower()]


def windows(ws, ctx):
    """(x, y): the ctx symbols before each position of each word (0 pads, '.'
    ends a word) and the symbol there."""
    xs, ys = [], []
    for w in ws:
        ids = [ord(c) - ord("a") + 1 for c in w] + [0]
        for pos, y in enumerate(ids):
            xs.append([ids[j] if j >= 0 else 0 for j in range(pos - ctx, pos)])
            ys.append(y)
    return torch.tensor(xs, dtype=torch.long), torch.tensor(ys, dtype=torch.long)


def dataset(ctx, n_words=4000, seed=0):
    """Train and held-out (x, y) windows from a shuffled sample of words."""
    ws = words()
    g = torch.Generator().manual_seed(seed)
    pick = torch.randperm(len(ws), generator=g)[:n_words].tolist()
    ws = [ws[i] for i in pick]
    cut = len(ws) * 9 // 10
    return windows(ws[:cut], ctx), windows(ws[cut:], ctx)


class CharMLP(nn.Module):
    def __init__(self, ctx=8, emb=16, hidden=384, layers=3):
        super().__init__()
        self.embed = nn.Embedding(V, emb)
        sizes = [ctx * emb] + [hidden] * layers
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))
        self.head = nn.Linear(hidden, V)

    def forward(self, x):  # x: (batch, ctx) symbols -> (batch, V) logits
        h = self.embed(x).flatten(1)
        for layer in self.hidden:
            h = torch.tanh(layer(h))
        return self.head(h)


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) / (d // self.heads) ** 0.5
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyTransformer(nn.Module):
    """A causal transformer reading ctx symbols; predicts the next one."""

    def __init__(self, ctx=8, d=64, heads=4, layers=2):
        super().__init__()
        self.embed = nn.Embedding(V, d)
        self.embed_pos = nn.Parameter(torch.randn(ctx, d) * 0.02)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, V)

    def forward(self, x):  # x: (batch, ctx) -> (batch, V) logits of the next symbol
        h = self.embed(x) + self.embed_pos
        for blk in self.blocks:
            h = blk(h)
        return self.head(self.ln(h)[:, -1])


def make(name, **sizes):
    return {"char": CharMLP, "transformer": TinyTransformer}[name](**sizes)
