"""
bert.py's speed tricks, out of the reader's way. Each is one marked section; bert.py calls it by
name. None changes a number: the tricks skip work, they do not change the arithmetic.

1. Packed rows: the layers see only the real tokens of a padded batch.
2. Frozen weights cast once: BERT_F's bf16 weights are made once, not at every product.
3. fp32 attention for bf16 on a CPU.
"""
import contextlib

import torch
import torch.nn as nn
import torch.nn.functional as F

# -----------------------------------------------------------------------------
# 1. packed rows: about half of an STS-B batch is padding, which no layer needs to multiply


class Rows:
    """The real tokens of a (B, T) batch as rows (N, H). mask: (B, 1, 1, T), True = attend."""

    def __init__(self, attention_mask, B, T):
        self.B, self.T, self.mask, self.keep = B, T, None, None  # no padding: no mask, no packing
        if attention_mask is not None and not attention_mask.all():
            self.mask = attention_mask.bool()[:, None, None, :]
            self.keep = attention_mask.flatten().nonzero().squeeze(1)  # the real rows' indices

    def pack(self, x):  # (B, T, ...) -> (N, D)
        x = x.reshape(self.B * self.T, -1)
        return x if self.keep is None else x.index_select(0, self.keep)

    def unpack(self, x):  # (N, D) -> (B, T, D), zeros at the padding
        if self.keep is not None:
            x = x.new_zeros(self.B * self.T, x.shape[-1]).index_copy(0, self.keep, x)
        return x.view(self.B, self.T, -1)

# -----------------------------------------------------------------------------
# 2. frozen weights cast once: autocast casts a weight at every product and keeps no cast of a
# weight that requires no grad, so a frozen model (BERT_F, an encoding) keeps its own


def linear(x, *linears):
    """x times the linears' weights side by side: q, k and v as one (N, 3H) product, one GEMM
    faster than three. Linears none of whose weights learn keep the weights as the product takes
    them until their storage or versions change; learning ones do not (fused AdamW changes them in
    place, versions unchanged)."""
    params = [m.weight for m in linears] + [m.bias for m in linears]
    if any(t.requires_grad for t in params):
        return F.linear(x, *join(params))
    dtype = (torch.get_autocast_dtype(x.device.type)
             if torch.is_autocast_enabled(x.device.type) else None)
    key = (dtype, tuple((t._version, t.data_ptr()) for t in params))
    kept = linears[0].__dict__.get("kept")
    if kept is None or kept[0] != key:
        w, b = join(params)
        kept = (key, (w.to(dtype), b.to(dtype)) if dtype else (w, b))
        linears[0].kept = kept
    return F.linear(x, *kept[1])


def join(params):  # [w1, ..., b1, ...] -> (weight, bias), each one tensor
    n = len(params) // 2
    return tuple(ts[0] if n == 1 else torch.cat(ts) for ts in (params[:n], params[n:]))


class Linear(nn.Linear):
    """nn.Linear whose frozen weights are cast once (linear)."""

    def forward(self, x):
        return linear(x, self)


@contextlib.contextmanager
def frozen(model):
    """A block in which no weight of model learns, so its products keep their weights; after it the
    flags are back and, for a model that learns, what it kept is dropped."""
    flags = [p.requires_grad for p in model.parameters()]
    model.requires_grad_(False)
    try:
        yield model
    finally:
        for p, flag in zip(model.parameters(), flags):
            p.requires_grad_(flag)
        if any(flags):
            for m in model.modules():
                m.__dict__.pop("kept", None)

# -----------------------------------------------------------------------------
# 3. fp32 attention for bf16 on a CPU: faster there than torch's bf16 kernels (docs/notes.md)


def attention(q, k, v, mask, dropout_p):
    """scaled_dot_product_attention; bf16 q, k, v on a CPU run in fp32, outside autocast (which
    would cast them back to bf16)."""
    if q.dtype != torch.bfloat16 or q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    with torch.autocast("cpu", enabled=False):
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask,
                                              dropout_p=dropout_p)
