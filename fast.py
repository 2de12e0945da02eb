"""
bert.py's speed tricks, out of the reader's way: one marked section each, called by name from
bert.py. They skip work; none changes a number.
"""
import contextlib

import torch
import torch.nn as nn
import torch.nn.functional as F

# -----------------------------------------------------------------------------
# packed rows: the layers see only the real tokens (about half of an STS-B batch is padding)


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
# frozen weights cast once: autocast casts a weight at every product, and keeps no cast of a
# weight that needs no grad (BERT_F's, at every step)


def linear(x, *linears):
    """x times the linears' weights side by side (q, k and v: one GEMM, faster than three).
    Linears that do not learn keep their weights as the product takes them until these change;
    learning ones cannot (fused AdamW changes them in place, their versions unchanged)."""
    w, b = [m.weight for m in linears], [m.bias for m in linears]
    if any(t.requires_grad for t in w + b):
        return F.linear(x, *join(w, b))
    device = x.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
    key = (dtype, [(t._version, t.data_ptr()) for t in w + b])
    kept = linears[0].__dict__.get("kept")
    if kept is None or kept[0] != key:
        kept = linears[0].kept = (key, [t.to(dtype) if dtype else t for t in join(w, b)])
    return F.linear(x, *kept[1])


def join(w, b):
    return (w[0], b[0]) if len(w) == 1 else (torch.cat(w), torch.cat(b))


class Linear(nn.Linear):

    def forward(self, x):
        return linear(x, self)


@contextlib.contextmanager
def frozen(model):
    """A block in which no weight of model learns, so its linears keep their weights; after it
    the flags are back, and a model that learns drops what it kept."""
    flags = [p.requires_grad for p in model.parameters()]
    model.requires_grad_(False)
    try:
        yield model
    finally:
        for p, flag in zip(model.parameters(), flags):
            p.requires_grad_(flag)
        for m in model.modules() if any(flags) else []:
            m.__dict__.pop("kept", None)

# -----------------------------------------------------------------------------
# fp32 attention for bf16 on a CPU: faster there than torch's bf16 kernels (docs/notes.md)


def attention(q, k, v, mask, dropout_p):
    if q.dtype != torch.bfloat16 or q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    with torch.autocast("cpu", enabled=False):  # else it would cast q, k, v back to bf16
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask,
                                              dropout_p=dropout_p)
