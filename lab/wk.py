"""
WK pooling (Wang and Kuo, "SBERT-WK: A Sentence Embedding Method by Dissecting BERT-based Word Models", 2020): a
sentence vector from the hidden states of an untrained model, no training. Each token's layer representations are
fused with weights from how new each layer is to its neighbouring layers (novelty) and how little it agrees with them
(alignment); tokens are weighted by how much their representation changes across layers.

We follow the official code (BinWang28/SBERT-WK-Sentence-Embedding, utils.py: dissecting / unify_token /
unify_sentence) where it differs from the paper (the README's code-vs-paper table):
- layers layer_start..l (hidden states; 0 = embeddings), default l // 3 (4 for a 12-layer BERT, as the code);
- tokens 0..n-2 of each sentence: [CLS] kept, the final [SEP] dropped;
- the context of layer k is token_feature[k-m:k] and [k+1:k+m+1] as Python slices, so below layer m the left side is
  empty (a negative slice start), not truncated; the window is [left, right, centre] with the centre last;
- alignment: mean of the column-normalised R[:-1, :-1] dotted with R[:-1, -1], over ||R[:-1, -1]||, then
  1 / (that * columns * 2); novelty |R[-1, -1]| / ||R[:, -1]||; each normalised over layers, added, renormalised;
- token weight: the population variance of the cosines between consecutive layers, normalised over the sentence.

The per-sentence, per-token, per-layer loops of the code become batched tensor operations over every (token, layer)
of the batch, in float64 (as the code's numpy), on the device of the hidden states: each token's S x S Gram matrix
over its layers, and each window's R as the Cholesky factor of a block of it (layer_weights says why that is the R of
the code's QR).
"""
import torch


def default_layer_start(num_layers):
    """The first hidden state used: l // 3 (SBERT-WK's 4 for 12 layers; 2 for a 6-layer model)."""
    return num_layers // 3


def context(k, n_layers, window):
    """Indices of the window of layer k as the code slices it: left [k-m:k], right [k+1:k+m+1], centre k last."""
    return [*range(n_layers)[k - window:k], *range(n_layers)[k + 1:k + window + 1], k]


def layer_weights(x, gram, window):
    """x (N, S, d) float64: N tokens' representations in S layers, gram (N, S, S) = x x^T -> their layer weights
    (N, S), summing to 1.

    All the code reads from a window A (d x c, the centre last) is the R of its QR, and R is also the Cholesky factor
    of the window's Gram matrix A^T A = R^T R, up to the sign of each row, which neither score depends on (flipping
    row i flips unit[i] and r[i] together). So one S x S Gram matrix per token holds every window of that token: each
    window's R comes from a c x c block of it, without gathering or factoring the d-wide windows (a window whose
    vectors are linearly dependent, where Cholesky fails, takes the QR of its vectors, as the code)."""
    N, S, _ = x.shape
    align, novelty = x.new_zeros(N, S), x.new_zeros(N, S)
    groups = {}
    for k in range(S):  # layers whose windows have the same number of columns are factored together
        idx = context(k, S, window)
        groups.setdefault(len(idx), []).append((k, idx))
    for c, members in groups.items():
        ks, idx = [k for k, _ in members], torch.tensor([i for _, i in members], device=x.device)  # (layers, c)
        chol, info = torch.linalg.cholesky_ex(gram[:, idx[:, :, None], idx[:, None, :]])  # (N, layers, c, c)
        R = chol.transpose(-1, -2)
        n, j = (info != 0).nonzero(as_tuple=True)
        if len(n):  # rank-deficient windows: the QR of their d x c vectors
            R[n, j] = torch.linalg.qr(x[n[:, None], idx[j]].transpose(-1, -2), mode="r").R
        r = R[..., :-1, -1]  # the centre vector's coordinates in the context's basis
        unit = R[..., :-1, :-1] / R[..., :-1, :-1].norm(dim=-2, keepdim=True)  # context columns, unit length
        beta = (unit.mean(-1) * r).sum(-1) / r.norm(dim=-1)
        align[:, ks] = 1 / (beta * c * 2)
        novelty[:, ks] = R[..., -1, -1].abs() / R[..., :, -1].norm(dim=-1)
    alpha = align / align.sum(1, keepdim=True) + novelty / novelty.sum(1, keepdim=True)
    return alpha / alpha.sum(1, keepdim=True)


def wk_pool(hidden_states, attention_mask, layer_start, window=2):
    """hidden_states: the L+1 (B, T, d) tensors of bert.Bert (0 = embeddings); attention_mask (B, T), right-padded,
    [CLS] first and [SEP] last -> (B, d) sentence vectors, in the hidden states' dtype."""
    L = len(hidden_states) - 1
    if not 0 <= layer_start <= L - 2:  # two states: one cosine between layers, zero variance, 0/0 token weights
        raise ValueError(f"WK layer_start {layer_start}: give 0..{L - 2} (WK needs at least three of the hidden states "
                         f"0..{L})")
    S = L + 1 - layer_start
    if not 1 <= window < S:  # window >= S: the code's slices leave some layer no context at all (its NaN)
        raise ValueError(f"WK window {window}: give 1..{S - 1} for the {S} hidden states {layer_start}..{L}")
    B, T, d = hidden_states[-1].shape
    used = torch.arange(T, device=attention_mask.device)[None] < (attention_mask.sum(1) - 1)[:, None]  # no final [SEP]
    x = torch.stack([h[used] for h in hidden_states[layer_start:]], 1).double()  # (N, S, d): every used token
    sent = torch.arange(B, device=used.device)[:, None].expand_as(used)[used]  # (N,) its sentence
    gram = x @ x.transpose(1, 2)  # (N, S, S): every window of a token is a block of it, and so are its cosines
    tokens = torch.einsum("ns,nsd->nd", layer_weights(x, gram, window), x)  # (N, d) unified token vectors
    # token weight: the variance (population) of the cosines between consecutive layers, normalised per sentence
    norms, near = gram.diagonal(dim1=1, dim2=2).sqrt(), gram.diagonal(offset=1, dim1=1, dim2=2)  # (N, S), (N, S-1)
    var = (near / (norms[:, :-1] * norms[:, 1:])).var(1, unbiased=False)
    total = torch.zeros(B, dtype=x.dtype, device=x.device).index_add_(0, sent, var)
    out = torch.zeros(B, d, dtype=x.dtype, device=x.device)
    out.index_add_(0, sent, (var / total[sent])[:, None] * tokens)
    return out.to(hidden_states[-1].dtype)
