"""
ConSERT's data augmentations: ways to make a second view of a sentence inside BERT, acting on its position ids or on
its embedding output (after the embedding LayerNorm and dropout, before layer 1).

Reference: Yan et al., "ConSERT: A Contrastive Framework for Self-Supervised Sentence Representation Transfer",
ACL 2021, section 3.2, as its code applies them (yym6472/ConSERT, the modified transformers/modeling_bert.py,
BertModel._replace_position_ids and _cutoff_embeddings):

    shuffle             a random permutation of the position ids of the n real tokens ([CLS] and [SEP] included);
                        the input's token order is unchanged
    token-cutoff:r      zero int(n * r) random real-token rows of the embedding output
    feature-cutoff:r    zero int(H * r) random hidden dimensions at every real token
    dropout:r           zero int(n * H * r) random elements of the real-token rows, no rescaling (ConSERT's "random"
                        cutoff: an exact count, like the other two, rather than a Bernoulli draw)
    none                the sentence as it is

[PAD] positions and the attention mask are never touched (ConSERT's feature cutoff also zeroes the pad rows, which
nothing attends to or pools, so the result is the same). Every draw depends only on the sentence's own length n and
the generator, one sentence after the other: the same sentence gets the same treatment whatever the batch's padded
length. ConSERT's adversarial augmentation needs NLI labels (it is only used supervised) and is left out.

torch is imported where it is used: the command line checks --aug1 / --aug2 with parse() before torch loads.
"""
from dataclasses import dataclass

KINDS = ("none", "shuffle", "token-cutoff", "feature-cutoff", "dropout")


@dataclass(frozen=True)
class Augmentation:
    kind: str = "none"
    rate: float = 0.0

    def position_ids(self, mask, gen):
        """(b, T) position ids, or None for BERT's own 0..T-1."""
        if self.kind != "shuffle":
            return None
        import torch
        b, T = mask.shape
        pos = torch.arange(T).repeat(b, 1)  # (b, T); pads keep their positions n..T-1
        for i, n in enumerate(mask.sum(1).tolist()):
            pos[i, :n] = torch.randperm(n, generator=gen)
        return pos.to(mask.device)

    def embedding_fn(self, mask, gen):
        """A function of the embedding output (b, T, H) -> (b, T, H), or None. The zeroing is a multiplicative mask
        (drawn when the function is applied), so gradients flow through the kept entries."""
        if self.kind in ("none", "shuffle"):
            return None
        import torch
        lengths = mask.sum(1).tolist()

        def apply(x):
            b, T, H = x.shape
            keep = torch.ones(b, T, H)
            for i, n in enumerate(lengths):
                if self.kind == "token-cutoff":
                    keep[i, torch.randperm(n, generator=gen)[:int(n * self.rate)]] = 0
                elif self.kind == "feature-cutoff":
                    keep[i, :n, torch.randperm(H, generator=gen)[:int(H * self.rate)]] = 0
                else:  # dropout: elements of the (n, H) real-token block, indexed row-major
                    flat = keep[i, :n].reshape(-1)
                    flat[torch.randperm(n * H, generator=gen)[:int(n * H * self.rate)]] = 0
                    keep[i, :n] = flat.view(n, H)
            return x * keep.to(device=x.device, dtype=x.dtype)
        return apply


def parse(spec):
    """'feature-cutoff:0.2' -> Augmentation; raises ValueError with a one-line reason."""
    kind, _, rate = spec.partition(":")
    if kind not in KINDS:
        raise ValueError(f"{spec!r}: unknown augmentation (choose from {', '.join(KINDS)})")
    if kind in ("none", "shuffle"):
        if rate:
            raise ValueError(f"{spec!r}: {kind} takes no rate")
        return Augmentation(kind)
    try:
        r = float(rate)
    except ValueError:
        raise ValueError(f"{spec!r}: expected {kind}:RATE with 0 < RATE < 1, e.g. {kind}:0.2") from None
    if not 0 < r < 1:
        raise ValueError(f"{spec!r}: the rate must be in (0, 1)")
    return Augmentation(kind, r)


def forward(model, ids, mask=None, position_ids=None, embedding_fn=None):
    """model(ids, mask) (a bert.Bert, or its DDP wrapper) with the two hooks bert.Bert leaves to the lab:
    position_ids (b, T) in place of 0..T-1 (the shuffle; PromptBERT's template alone), and embedding_fn applied
    to the embedding output (b, T, H) before layer 1 (the cutoffs; DiffCSE's conditioning). Torch module hooks
    on the embeddings, for this call only: a DDP wrapper still runs its own forward."""
    import runtime
    hooks = embedding_hooks(runtime.raw(model), position_ids, embedding_fn)
    try:
        return model(ids, mask)
    finally:
        for h in hooks:
            h.remove()


def embedding_hooks(bert, position_ids=None, embedding_fn=None):
    """The handles of forward's two hooks on bert's embeddings, registered until removed."""
    emb, hooks = bert.embeddings, []
    if position_ids is not None:  # the positions' embedding takes position_ids, not arange(T)
        hooks.append(emb.position_embeddings.register_forward_pre_hook(lambda m, args: (position_ids,)))
    if embedding_fn is not None:
        hooks.append(emb.register_forward_hook(lambda m, args, out: embedding_fn(out)))
    return hooks
