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

The per-sentence, per-token, per-layer loops of the code become one batched torch.linalg.qr per window size over
every (token, layer) of the batch, in float64 (as the code's numpy), on the device of the hidden states.
"""
import torch


def default_layer_start(num_layers):
    """The first hidden state used: l // 3 (SBERT-WK's 4 for 12 layers; 2 for a 6-layer model)."""
    return num_layers // 3


def context(k, n_layers, window):
    """Indices of the window of layer k as the code slices it: left [k-m:k], right [k+1:k+m+1], centre k last."""
    return [*range(n_layers)[k - window:k], *range(n_layers)[k + 1:k + window + 1], k]


def layer_weights(x, window):
    """x (N, S, d) float64: N tokens' representations in S layers -> their layer weights (N, S), summing to 1."""
    N, S, _ = x.shape
    align, novelty = x.new_zeros(N, S), x.new_zeros(N, S)
    groups = {}
    for k in range(S):  # layers whose windows have the same number of columns share one batched QR
        idx = context(k, S, window)
        groups.setdefault(len(idx), []).append((k, idx))
    for c, members in groups.items():
        ks = [k for k, _ in members]
        win = x[:, [i for _, idx in members for i in idx]].view(N, len(ks), c, -1)  # (N, layers, c, d)
        R = torch.linalg.qr(win.transpose(-1, -2), mode="r").R  # (N, layers, c, c); QR of the d x c window
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
    hs = torch.stack(hidden_states[layer_start:], 2).double()  # (B, T, S, d)
    lengths = attention_mask.sum(1)
    used = torch.arange(hs.shape[1], device=hs.device)[None] < (lengths - 1)[:, None]  # drop the final [SEP]
    x = hs[used]  # (N, S, d): every used token of the batch
    sent = torch.arange(hs.shape[0], device=hs.device)[:, None].expand_as(used)[used]  # (N,) its sentence
    tokens = (layer_weights(x, window)[..., None] * x).sum(1)  # (N, d) unified token vectors
    # token weight: the variance (population) of the cosines between consecutive layers, normalised per sentence
    var = torch.nn.functional.cosine_similarity(x[:, :-1], x[:, 1:], dim=-1).var(1, unbiased=False)
    total = torch.zeros(hs.shape[0], dtype=x.dtype, device=x.device).index_add_(0, sent, var)
    out = torch.zeros(hs.shape[0], hs.shape[-1], dtype=x.dtype, device=x.device)
    out.index_add_(0, sent, (var / total[sent])[:, None] * tokens)
    return out.to(hidden_states[-1].dtype)
