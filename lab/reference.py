"""
The oracles that tests and bench.py share: the official code's formulations (galsang/SG-BERT's L^opt3 and its training
step, the SBERT-WK code's WK pooling), written from their structure in plain loops, float64 where the original is
numpy. Each computes what sgbert's fast version computes, the slow way, so that a test can check equality and bench.py
can time the difference. No tool imports this file.
"""
import copy

import numpy as np
import torch
import torch.nn.functional as F

import bert
import sg_loss
import train

# -----------------------------------------------------------------------------
# SG-OPT: the official loss and training step


def official_sg_opt(c, h, tau, unbind=False):
    """L^opt3 the way the official code (galsang/SG-BERT) builds it; written from its structure, not copied.

    For each layer k a (b, b) similarity between c and the views h[:, k], positives on the diagonal; for each
    anchor i the similarities to all views of the other sentences at all layers, gathered into a (b, (b-1)*L)
    negatives matrix; then per layer logits = cat([positive, negatives]) / tau, i.e. the negatives are materialised
    again for every layer, cross-entropy with label 0, and the mean over layers. unbind=True takes the layers as
    separate tensors (as when they come from a list of hidden states) instead of indexing h[:, k], whose backward
    writes a zero-filled (b, L, p) gradient per layer.
    """
    b, L, p = h.shape
    c = F.normalize(c, dim=-1)
    views = h.unbind(1) if unbind else [h[:, k] for k in range(L)]
    sims = torch.stack([c @ F.normalize(hk, dim=-1).T for hk in views], dim=1)  # (b, L, b): cos(c_i, h_jk)
    others = ~torch.eye(b, dtype=torch.bool, device=c.device)
    negs = sims.permute(0, 2, 1)[others].reshape(b, (b - 1) * L)  # (b, (b-1)*L): views of sentences j != i
    labels = torch.zeros(b, dtype=torch.long, device=c.device)
    loss = 0.0
    for k in range(L):
        logits = torch.cat([sims[:, k].diagonal()[:, None], negs], dim=1) / tau  # (b, 1 + (b-1)*L), per layer
        loss = loss + F.cross_entropy(logits, labels)
    return loss / L


def hf_bert(path, device="cpu"):
    """transformers.BertModel with sdpa attention and no pooler (ours has none: the same parameters, the same work)."""
    import transformers
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    model = transformers.BertModel.from_pretrained(path, attn_implementation="sdpa", add_pooling_layer=False)
    return model.to(device)


def param_groups(modules, weight_decay):
    """AdamW groups as the official code's: weight decay on weight matrices, none on biases and LayerNorm."""
    decay, no_decay = [], []
    for m in modules:
        for name, p in m.named_parameters():
            if p.requires_grad:
                (no_decay if name.endswith("bias") or "LayerNorm" in name else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def reference_step_run(path, cfg, batches, counter, steps, device):
    """The reference side of make_step_run: transformers.BertModel, the official loss, the norm-loop regulariser and
    torch's per-parameter AdamW (the nearest stand-in for the transformers.AdamW the official code used)."""
    bert_F = hf_bert(path).to(device).train(cfg.dropout == "on")
    bert_T = copy.deepcopy(bert_F).train(cfg.dropout == "on").requires_grad_(True)
    bert_T.embeddings.requires_grad_(False)  # as train.py: BERT_T's embeddings stay frozen
    bert_F.requires_grad_(False)  # the official code freezes BERT_F, as train.py does
    torch.manual_seed(cfg.seed)  # the same head as train.build_run's
    head = sg_loss.ProjectionHead(bert_F.config.hidden_size, cfg.proj_size).to(device)
    optimizer = torch.optim.AdamW(param_groups([bert_T, head], cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.9),
                                  eps=1e-6)  # torch's per-parameter loop, where train.adamw is fused
    trainable = [p for g in optimizer.param_groups for p in g["params"]]
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.precision == "bf16")  # as train.py

    def step(ids, mask, i):
        # BERT_F frozen and run without autograd, as the official code does: what the reference differs in is
        # transformers' BertModel, the official loss formulation, the norm-loop regulariser and a per-parameter AdamW
        with torch.no_grad(), autocast:
            hs = bert_F(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
            h = torch.stack([bert.masked_mean(x, mask) for x in hs], 1)  # (b, L, H), the same views
        with autocast:
            c = bert_T(input_ids=ids, attention_mask=mask).last_hidden_state[:, 0]
            b, L, H = h.shape  # the same head, the same way as train.train_step
            z = head(torch.cat([c, h.reshape(b * L, H)]))
            zc, zh = z[:b].float(), z[b:].float().view(b, L, -1)
        loss = official_sg_opt(zc, zh, cfg.tau)  # the loss section's reference formulation
        reg = 0.0  # the official regulariser: a Python loop of per-parameter norms, added to the loss, backpropagated
        for p_T, p_F in zip(bert_T.parameters(), bert_F.parameters()):
            reg = reg + torch.norm(p_T - p_F) ** 2
        optimizer.zero_grad(set_to_none=True)
        (loss + cfg.lam * reg).backward()
        for g in optimizer.param_groups:
            g["lr"] = train.get_lr(i, cfg.max_steps, cfg.lr)
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        return loss.detach(), (cfg.lam * reg).detach()

    def run_steps():
        for _ in range(steps):
            out = step(*next(batches), next(counter))
        return out
    return run_steps


# -----------------------------------------------------------------------------
# WK pooling: the SBERT-WK code's loop


def unit_columns(a):
    n = np.linalg.norm(a, axis=0)
    return a / np.where(n == 0, 1, n)  # sklearn's normalize(axis=0): a zero column stays zero


def wk_unify_token(feats, m):
    """One token's (S, d) layer representations -> its unified vector: the SBERT-WK code's unify_token."""
    S = feats.shape[0]
    align, novelty = np.zeros(S), np.zeros(S)
    for k in range(S):
        window = np.vstack([feats[k - m:k], feats[k + 1:k + m + 1], feats[k][None]])  # Python slices, centre last
        _, R = np.linalg.qr(window.T)
        r = R[:, -1]
        align[k] = np.mean(unit_columns(R[:-1, :-1]), axis=1).dot(R[:-1, -1]) / np.linalg.norm(r[:-1])
        align[k] = 1 / (align[k] * window.shape[0] * 2)
        novelty[k] = abs(r[-1]) / np.linalg.norm(r)
    alpha = align / align.sum() + novelty / novelty.sum()
    return feats.T.dot(alpha / alpha.sum())


def wk_reference(hidden_states, mask, layer_start, m):
    """WK pooling as the SBERT-WK code runs it after the forward pass: per sentence, its tokens 0..n-2 ([CLS] kept,
    the last [SEP] dropped), per token its layers, in float64 numpy (the oracle of tests/test_wk.py)."""
    hs = np.stack([h.double().cpu().numpy() for h in hidden_states[layer_start:]], 1)  # (B, S, T, d)
    out = []
    for b in range(hs.shape[0]):
        n = int(mask[b].sum()) - 1
        feats = hs[b, :, :n]  # (S, n, d)
        tokens = np.stack([wk_unify_token(feats[:, t], m) for t in range(n)])
        var = np.zeros(n)
        for t in range(n):  # the variance of the cosines between consecutive layers
            f = feats[:, t] / np.linalg.norm(feats[:, t], axis=1, keepdims=True)
            var[t] = np.var((f @ f.T).diagonal(-1))
        out.append(tokens.T.dot(var / var.sum()))
    return np.stack(out)
