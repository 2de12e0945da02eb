"""The methods after 2021 (methods.py: esimcse, sscl, sg-opt-sscl, diffcse) against oracles: every new loss against a
float64 loop written from its paper's equations; ESimCSE's word repetition, momentum update and queue against plain
loops; SSCL's negatives against an explicit concatenation of the hidden states as its code builds it; DiffCSE's
per-sentence terms against diffcse.electra_loss of the padded batch, and its masks the same on any number of
processes; each method's flags in --help, a generator that cannot be one refused in one line. torchrun 2 processes =
1 process for each: tests/test_distributed.py."""
import copy
import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import bert
from lab import diffcse
from lab import methods
from lab import pretrain
import sg_loss
from lab import train  # the lab's trainer: every method
import train as core_train
from test_sg_loss import inputs, phi, sg_opt_oracle
from test_train import run, world  # noqa: F401 (the tiny model, data folder and sentences)

NEW = ("esimcse", "sscl", "sg-opt-sscl", "diffcse")

# -----------------------------------------------------------------------------
# the losses against float64 loops of the papers' equations (phi(u, v) = exp(cos(u, v) / tau), test_sg_loss.py)


def infonce_oracle(c, h, tau, negatives=None):
    """SimCSE's InfoNCE, with ESimCSE's Eq. 2 / SSCL's Eq. 5 negatives n_m in every denominator:
    mean over i of -log( phi(c_i, h_i) / (sum_j phi(c_i, h_j) + sum_m phi(c_i, n_m)) )."""
    total = 0.0
    for i in range(len(c)):
        den = phi(c[i], h, tau).sum() + (0.0 if negatives is None else phi(c[i], negatives, tau).sum())
        total = total - torch.log(phi(c[i], h[i], tau) / den)
    return total / len(c)


def sg_opt_negatives_oracle(c, h, n, tau):
    """L^opt3 with n_m in every denominator: mean over i, k of -log( phi(c_i, h_ik) / (phi(c_i, h_ik) +
    sum_{m != i} sum_n phi(c_i, h_mn) + sum_m phi(c_i, n_m)) )."""
    b, L, p = h.shape
    total = 0.0
    for i in range(b):
        neg = phi(c[i], torch.cat([h[:i], h[i + 1:]]).reshape(-1, p), tau).sum() + phi(c[i], n, tau).sum()
        pos = phi(c[i], h[i], tau)
        total = total - torch.log(pos / (pos + neg)).sum()
    return total / (b * L)


def grads(fn, *xs):
    xs = [x.clone().requires_grad_() for x in xs]
    loss = fn(*xs)
    loss.backward()
    return [loss.detach(), *(x.grad for x in xs)]


def assert_close(ours, ref):
    for a, r in zip(ours, ref):
        torch.testing.assert_close(a, r, rtol=1e-10, atol=1e-12)


def check_rows(loss, *z, tau=0.05, parts=2):
    """Equal row slices averaged over the processes: the loss over all anchors (train_step's contract)."""
    b = len(z[0])
    share = b // parts
    each = [loss(*z, tau, rows=slice(r * share, (r + 1) * share)) for r in range(parts)]
    torch.testing.assert_close(sum(each) / parts, loss(*z, tau), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("b,n,tau", [(1, 3, 0.05), (4, 0, 0.05), (6, 10, 0.05), (8, 33, 1.0)])
def test_infonce_with_more_negatives_is_esimcses_equation(b, n, tau):
    c, h = inputs(b, 1, 16, seed=b)
    h, q = h[:, 0], torch.randn(n, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    ours = grads(lambda c, h, q: methods.L_queue(c, h, q, tau), c, h, q)
    assert_close(ours, grads(lambda c, h, q: infonce_oracle(c, h, tau, q), c, h, q))
    assert_close(grads(lambda c, h: sg_loss.opt2(c, h, tau), c, h), grads(lambda c, h: infonce_oracle(c, h, tau), c, h))
    if b % 2 == 0:
        check_rows(methods.L_queue, c, h, q, tau=tau)


@pytest.mark.parametrize("b,L,n,tau", [(1, 3, 2, 0.05), (4, 5, 8, 0.01), (7, 13, 14, 1.0)])
def test_sg_opt_with_more_negatives_is_its_equation(b, L, n, tau):
    c, h = inputs(b, L, 16, seed=L)
    neg = torch.randn(n, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    ours = grads(lambda c, h, m: sg_loss.sg_opt(c, h, tau, negatives=m), c, h, neg)
    assert_close(ours, grads(lambda c, h, m: sg_opt_negatives_oracle(c, h, m, tau), c, h, neg))


@pytest.mark.parametrize("b,K,tau", [(2, 1, 0.05), (6, 4, 0.05), (8, 2, 1.0)])
def test_sscl_is_the_mean_of_infonce_with_and_without_the_lower_layers(b, K, tau):
    """SSCL's cl_forward: (loss with the lower layers' vectors of every sentence as negatives + SimCSE's) / 2."""
    c, h = inputs(b, 1, 16, seed=K)
    h, n = h[:, 0], torch.randn(b, K, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(b))

    def oracle(c, h, n):
        return (infonce_oracle(c, h, tau) + infonce_oracle(c, h, tau, n.reshape(-1, 16))) / 2
    assert_close(grads(lambda c, h, n: methods.L_sscl(c, h, n, tau), c, h, n), grads(oracle, c, h, n))
    check_rows(methods.L_sscl, c, h, n, tau=tau)


@pytest.mark.parametrize("b,L,K,tau", [(2, 3, 1, 0.01), (6, 7, 2, 0.01), (4, 13, 3, 1.0)])
def test_sg_opt_sscl_is_the_mean_of_l_opt3_with_and_without_bert_ts_lower_layers(b, L, K, tau):
    c, h = inputs(b, L, 16, seed=b + L)
    n = torch.randn(b, K, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(K))

    def oracle(c, h, n):
        return (sg_opt_oracle(c, h, tau) + sg_opt_negatives_oracle(c, h, n.reshape(-1, 16), tau)) / 2
    assert_close(grads(lambda c, h, n: methods.L_opt3_sscl(c, h, n, tau), c, h, n), grads(oracle, c, h, n))
    check_rows(methods.L_opt3_sscl, c, h, n, tau=tau)


@pytest.mark.parametrize("b,tau", [(2, 0.05), (8, 0.05), (6, 1.0)])
def test_diffcse_is_infonce_plus_the_mean_of_its_sentences_rtd_terms(b, tau):
    c, h = inputs(b, 1, 16, seed=b)
    rho = torch.rand(b, dtype=torch.float64, generator=torch.Generator().manual_seed(b))

    def oracle(c, h, rho):
        return infonce_oracle(c, h[:, 0], tau) + sum(rho[i] for i in range(b)) / b
    assert_close(grads(lambda c, h, r: methods.L_rtd(c, h[:, 0], r, tau), c, h, rho), grads(oracle, c, h, rho))
    check_rows(methods.L_rtd, c, h[:, 0], rho, tau=tau)

# -----------------------------------------------------------------------------
# ESimCSE: word repetition, the momentum update and the queue


def repeated_oracle(ids, mask, rate, u, keys, max_positions):
    """ESimCSE/train.py's bpe repetition as a loop over each sentence's token list, with the given draws: dup_len =
    randrange(min(10, int(rate n))) as floor(u k), random.sample(range(1, n - 1), dup_len) as the smallest keys."""
    rows = []
    for i in range(len(ids)):
        n = int(mask[i].sum())
        toks = ids[i, :n].tolist()
        k = min(10, int(rate * n))
        dup = min(math.floor(float(u[i]) * k), max_positions - n)
        chosen = sorted(range(1, n - 1), key=lambda j: float(keys[i, j]))[:dup]
        rows.append([t for j, t in enumerate(toks) for _ in range(2 if j in chosen else 1)])
    return rows


def test_word_repetition_against_a_loop():
    g = torch.Generator().manual_seed(0)
    lengths = [2, 3, 4, 7, 12, 31, 32, 32, 20, 9]
    T = max(lengths)
    ids = torch.randint(5, 100, (len(lengths), T), generator=g)
    mask = (torch.arange(T) < torch.tensor(lengths)[:, None]).long()
    ids = ids * mask
    for rate, max_positions in ((0.32, 512), (0.9, 512), (0.32, 34), (0.0, 512)):
        u, keys = torch.rand(len(ids), generator=g), torch.rand(len(ids), T + 3, generator=g)
        out, out_mask = methods.repeated((ids, mask), rate, u, keys, 0, max_positions)
        want = repeated_oracle(ids, mask, rate, u, keys, max_positions)
        assert out.shape[1] == max(map(len, want)) <= max_positions
        for i, row in enumerate(want):
            assert out[i, :len(row)].tolist() == row and out_mask[i].tolist() == [1] * len(row) + [0] * (
                out.shape[1] - len(row)) and (out[i, len(row):] == 0).all()
            assert row[0] == ids[i, 0] and row[-1] == ids[i, lengths[i] - 1]  # [CLS] and [SEP] never repeated
    n = 32  # the recipe: 0 .. min(10, int(0.32 * 32)) - 1 = 0 .. 9 tokens repeated, each value drawn
    many = torch.full((4000, n), 7)
    u, keys = torch.rand(4000, generator=g), torch.rand(4000, n, generator=g)
    extra = methods.repeated((many, torch.ones_like(many)), 0.32, u, keys, 0, 512)[1].sum(1) - n
    assert set(extra.tolist()) == set(range(10))


def test_the_momentum_update_is_the_codes_arithmetic_against_a_loop():
    g = torch.Generator().manual_seed(0)
    ema = [torch.randn(5, 3, generator=g), torch.randn(7, generator=g)]
    theta = [torch.randn(5, 3, generator=g), torch.randn(7, generator=g)]
    want = [e.clone() for e in ema]
    for _ in range(3):
        for k in range(len(want)):
            want[k] = want[k] * 0.995 + theta[k] * (1 - 0.995)  # esimcse/models.py: param_m.data * m + param.data * (1 - m)
        methods.ema_(ema, theta, 0.995)
    assert all(torch.equal(a, b) for a, b in zip(ema, want))


def test_the_queue_keeps_the_newest_vectors_against_a_list():
    g = torch.Generator().manual_seed(0)
    for size in (0, 3, 8, 12, 100):
        q, rows = torch.zeros(0, 4), []
        for _ in range(5):
            z = torch.randn(8, 4, generator=g)
            q = methods.enqueue(q, z, size)
            rows = (rows + list(z))[-size:] if size else []
            assert len(q) == len(rows) and all(torch.equal(a, b) for a, b in zip(q, rows))


def tiny_run(world, loss, *flags):
    argv = ["--model", str(world["model"]), "--loss", loss, "--batch-size", "4", "--max-steps", "10", "--lr", "1e-2",
            "--dropout", "off", "--device", "cpu", "--out", str(world["out"]), *flags]
    if methods.takes(loss, "proj_size"):
        argv += ["--proj-size", "16"]
    if methods.takes(loss, "teacher_dropout"):
        argv += ["--teacher-dropout", "off"]
    cfg = methods.resolve_config(train.get_args(argv))
    sents = world["sents"].read_text().splitlines()
    r = train.build_run(cfg, bert.Bert.from_pretrained(world["model"]), bert.load_tokenizer(world["model"], 32),
                        sents, world["data"], torch.device("cpu"))
    return r, sents


def test_esimcse_steps_against_a_plain_loop_of_its_momentum_encoder_and_queue(world, capsys):
    """Three train_steps of ESimCSE (queue 6, batches of 4): each step's loss is InfoNCE against the queue of the
    steps before; after it, the momentum encoder is the EMA of BERT_T's weights before each step's update, and the
    queue the last 6 of its vectors of each step's sentences through the head of that step."""
    r, sents = tiny_run(world, "esimcse", "--queue-size", "6", "--momentum", "0.9", "--momentum-init", "pretrained")
    seen, real = [], r.method.sides
    r.method = dataclasses.replace(r.method, sides=lambda *a: seen.append(real(*a)) or seen[-1])
    base = copy.deepcopy(r.bert_T)
    ema = {k: v.clone() for k, v in base.named_parameters()}
    rows = []
    for step in range(3):
        x = train.inputs(r, sents[4 * step:4 * step + 4], None)
        theta = {k: v.detach().clone() for k, v in r.bert_T.named_parameters()}
        head = copy.deepcopy(r.head)
        queue = torch.stack(rows[-6:]) if rows else torch.zeros(0, 32)
        loss = train.train_step(r, 5 + step, *x)[0]
        z1, z2 = (t.detach().double() for t in seen[-1])
        torch.testing.assert_close(loss.double(), infonce_oracle(z1, z2, 0.05, queue.double() if rows else None),
                                   rtol=1e-6, atol=1e-6)
        for k, p in base.named_parameters():
            if p.requires_grad:  # BERT_T's frozen embeddings: the base model's, in both
                ema[k] = ema[k] * 0.9 + theta[k] * (1 - 0.9)
        with torch.no_grad():
            base.load_state_dict(ema, strict=False)
            rows += list(head(base.eval()(*x[0])[-1][:, 0]))  # the originals, [CLS], no dropout, the step's head
        assert all(torch.equal(p, ema[k]) for k, p in r.state.encoder.named_parameters())
        torch.testing.assert_close(r.state.queue, torch.stack(rows[-6:]), rtol=1e-6, atol=1e-6)
    assert len(r.state.queue) == 6 and not any(p.requires_grad for p in r.state.encoder.parameters())


def test_esimcses_momentum_encoder_starts_random_as_its_code_and_its_ema_moves_every_weight(world):
    """The default --momentum-init random: BERT's init, no weight equal to the base model's, and after a step every
    weight (the embeddings too) is m e + (1 - m) theta, pulled towards BERT_T."""
    r, sents = tiny_run(world, "esimcse", "--momentum", "0.9")
    base = bert.Bert.from_pretrained(world["model"])
    enc = dict(r.state.encoder.named_parameters())
    assert all(not torch.equal(enc[k], p) for k, p in base.named_parameters() if p.dim() == 2)
    assert enc["embeddings.LayerNorm.weight"].eq(1).all() and enc["encoder.layer.0.output.dense.bias"].eq(0).all()
    assert len(r.state.ema) == len(enc)  # every weight is in the EMA: the embeddings start random too
    start = {k: v.clone() for k, v in enc.items()}
    theta = {k: v.detach().clone() for k, v in r.bert_T.named_parameters()}
    train.train_step(r, 5, *train.inputs(r, sents[:4], None))
    for k, p in r.state.encoder.named_parameters():
        assert torch.equal(p, start[k] * 0.9 + theta[k] * (1 - 0.9)), k
    again, _ = tiny_run(world, "esimcse", "--momentum", "0.9")  # drawn from --seed: the same start
    assert all(torch.equal(p, start[k]) for k, p in again.state.encoder.named_parameters())


def test_esimcses_positive_is_its_sentence_repeated(world):
    """Side 2 reads side 1's sentences with tokens repeated (repeated(), the draws from run.gen), side 1 as they are."""
    r, sents = tiny_run(world, "esimcse")
    x1, x2 = train.inputs(r, sents[:4], None)
    g = copy.deepcopy(r.gen)
    u, keys = torch.rand(4, generator=g), torch.rand(4, r.cfg.max_len, generator=g)
    want = methods.repeated(x2, r.cfg.dup_rate, u, keys, 0, 64)
    with torch.no_grad():
        z1, z2 = methods.repeated_pair(r, x1, x2)
        c1, c2 = (bert.pool(r.bert_T(*x), x[1], "cls") for x in (x1, want))
        torch.testing.assert_close(z1, r.head(c1), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(z2, r.head(c2), rtol=1e-5, atol=1e-6)

# -----------------------------------------------------------------------------
# SSCL: the negatives against an explicit concatenation


def test_sscls_negatives_are_its_codes_concatenation(world):
    """sscl/models.py construct_negtives, written out: for i < K, the mean-pooled hidden_states[-2-i] of both passes
    as columns of z1's similarity matrix after SimCSE's; its loss (that cross-entropy + SimCSE's) / 2."""
    r, sents = tiny_run(world, "sscl", "--neg-layers", "2")  # 2 layers: hidden states 1 and 0 (the embeddings)
    x1, x2 = train.inputs(r, sents[:4], None)
    z1, z2, n = methods.two_passes_lower(r, x1, x2)
    hs1, hs2 = r.bert_T(*x1), r.bert_T(*x2)  # dropout off: the passes differ only if the code is wrong
    sim = lambda a, b: F.cosine_similarity(a.double()[:, None], b.double()[None], dim=-1) / 0.05  # noqa: E731
    cols = [sim(z1, z2)]
    for i in range(2):
        n1, n2 = bert.masked_mean(hs1[-2 - i], x1[1]), bert.masked_mean(hs2[-2 - i], x2[1])
        torch.testing.assert_close(n[:, 2 * i], n1, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(n[:, 2 * i + 1], n2, rtol=1e-5, atol=1e-6)
        cols += [sim(z1, n1), sim(z1, n2)]
    labels = torch.arange(4)
    want = (F.cross_entropy(torch.cat(cols, 1), labels) + F.cross_entropy(cols[0], labels)) / 2
    torch.testing.assert_close(methods.L_sscl(z1.double(), z2.double(), n.double(), 0.05), want)
    torch.testing.assert_close(z1, bert.masked_mean(hs1[-1], x1[1]), rtol=1e-5, atol=1e-6)  # no head


def test_sg_opt_sscls_negatives_are_bert_ts_lower_layers_through_f(world):
    r, sents = tiny_run(world, "sg-opt-sscl", "--neg-layers", "1")
    x1, _ = train.inputs(r, sents[:4], None)
    z1, z2, n = methods.views_of_F_lower(r, x1, x1)
    with torch.no_grad():
        hs = r.bert_T(*x1)
        want = r.head(hs[-2][:, 0])  # BERT_T's [CLS] of layer l-1, through f
        hs_F = r.bert_F(*x1)  # SG-OPT's own sides (train.train_step's): the same c_i and views
        z1_F = r.head(bert.pool(hs, x1[1], "cls"))
        z2_F = r.head(torch.stack([core_train.view(hs_F[k], x1[1], "mean") for k in r.layers], 1))
    assert n.shape == (4, 1, 16) and z2.shape == (4, 3, 16)
    torch.testing.assert_close(n[:, 0], want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(z1, z1_F, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(z2, z2_F, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("pooling,most", [("mean", 2), ("first-last", 1)])
def test_more_negative_layers_than_below_the_last_is_refused_in_one_line(world, capsys, pooling, most):
    with pytest.raises(SystemExit) as e:
        tiny_run(world, "sscl", "--neg-layers", str(most + 1), "--pooling", pooling)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and f"--neg-layers {most + 1}: the model has 2 layers" in err

# -----------------------------------------------------------------------------
# DiffCSE: the generator, the per-sentence terms and the masks


def generator_folder(world, name="gen", vocab_of=None, seed=3):
    """A random pretrain.py folder (a BERT and its MLM head) with the vocabulary of the world's model (or vocab_of)."""
    torch.manual_seed(seed)
    cfg = bert.Bert.from_pretrained(world["model"]).config
    model, head = bert.Bert(cfg), pretrain.make_head(cfg)
    with torch.no_grad():
        head.bias.normal_(std=0.5)  # so that the argmax varies: some tokens replaced, some not
    folder = world["tmp"] / name
    pretrain.write_folder(folder, model, head, bert.load_tokenizer(vocab_of or world["model"]), {})
    return folder


def test_diffcses_rtd_terms_are_lam_l_rtd_of_the_padded_batch(world):
    """rho's mean over the batch = lam * diffcse.electra_loss over both copies padded to one length (the code's mean
    over all positions), with the same corruption: the per-sentence split changes nothing on one process."""
    r, sents = tiny_run(world, "diffcse", "--generator", str(generator_folder(world)))
    x1, _ = train.inputs(r, sents[:4], None)
    z = torch.randn(8, 32, generator=torch.Generator().manual_seed(0))
    gen = copy.deepcopy(r.gen)
    rho = r.state.rtd(r, (x1, x1), (z[:4], z[4:]))
    r.gen = gen  # the same masks again, the loss made by diffcse.py's own pieces
    logits, ys = [], []
    for (ids, mask), zc in zip((x1, x1), (z[:4], z[4:])):
        x2, y = diffcse.replaced_tokens(r.state.G.fill(r.state.masked(r, ids, mask), mask), ids, mask)
        logits.append(r.state.D(zc, x2, mask))
        ys.append(y)
    want = 0.005 * diffcse.electra_loss(torch.cat(logits), torch.cat(ys))
    assert 0 < torch.cat(ys).float().mean() < 1  # some replaced, some not
    torch.testing.assert_close(rho.mean(), want, rtol=1e-6, atol=1e-9)


def test_diffcses_masks_are_the_same_on_any_number_of_processes(world):
    r, sents = tiny_run(world, "diffcse", "--generator", str(generator_folder(world)))
    ids, mask = train.inputs(r, sents[:8], None)[0]
    one = r.state.masked(SimpleNamespace(rank=0, world=1, cfg=r.cfg, gen=torch.Generator().manual_seed(5)), ids, mask)
    T = {k: int(mask[4 * k:4 * k + 4].sum(1).max()) for k in (0, 1)}  # each process pads to its own longest
    for k in (0, 1):
        run_k = SimpleNamespace(rank=k, world=2, cfg=r.cfg, gen=torch.Generator().manual_seed(5))
        part = r.state.masked(run_k, ids[4 * k:4 * k + 4, :T[k]], mask[4 * k:4 * k + 4, :T[k]])
        assert torch.equal(part, one[4 * k:4 * k + 4, :T[k]])
    assert (one != ids).any()


def test_diffcse_trains_its_discriminator_never_its_generator(world):
    r, sents = tiny_run(world, "diffcse", "--generator", str(generator_folder(world)))
    G0, D0 = copy.deepcopy(r.state.G.state_dict()), copy.deepcopy(r.state.D.state_dict())
    trained = {id(p) for p in r.trainable}
    assert all(id(p) in trained for p in r.state.D.parameters())
    assert not any(id(p) in trained for p in r.state.G.parameters())
    train.train_step(r, 5, *train.inputs(r, sents[:4], None))
    assert all(torch.equal(v, G0[k]) for k, v in r.state.G.state_dict().items())
    assert any(not torch.equal(v, D0[k]) for k, v in r.state.D.state_dict().items())
    assert methods.METHODS["diffcse"].recipe == diffcse.RECIPE  # the run script's values, written once in each file
    cfg = methods.resolve_config(train.get_args(["--loss", "diffcse"]))
    assert (cfg.rtd_weight, cfg.mask_rate, cfg.generator) == (diffcse.CONFIG["lam"], diffcse.CONFIG["mask_rate"],
                                                              cfg.model)


def test_a_generator_that_cannot_be_one_is_refused_in_one_line(world, capsys, tmp_path):
    """The model without an MLM head (as MiniLM) and no --generator; a generator of another vocabulary."""
    other = tmp_path / "other"
    bert_words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "x", "y"]
    other.mkdir()
    (other / "vocab.txt").write_text("\n".join(bert_words) + "\n")
    for flags, why in (((), "has no masked-LM head"), (("--generator", str(generator_folder(world, "g2", other))),
                                                       "its vocabulary is not the model's")):
        with pytest.raises(SystemExit) as e:
            tiny_run(world, "diffcse", *flags)
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1 and err.startswith("error: --generator ") and why in err, err


def test_diffcses_record_names_its_generator(world):
    folder = generator_folder(world)
    result = run(world, "--loss", "diffcse", "--generator", str(folder), "--max-steps", "2", "--dropout", "off")
    assert result["generator"] == folder.name and result["generator_sha256"]
    assert train.checkpoint.read_metadata(world["out"])["args"]["generator"] == str(folder)

# -----------------------------------------------------------------------------
# the command line


@pytest.mark.parametrize("loss,own", [("esimcse", ["--dup-rate", "--queue-size", "--momentum"]),
                                      ("sscl", ["--neg-layers"]), ("sg-opt-sscl", ["--neg-layers", "--lam"]),
                                      ("diffcse", ["--generator", "--rtd-weight", "--mask-rate"])])
def test_help_lists_each_methods_flags(loss, own, capsys):
    with pytest.raises(SystemExit) as e:
        train.get_args(["--loss", loss, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert e.value.code == 0 and loss in out and all(f in out for f in own)
    for flag in own:  # and each is a flag of this method, the others refuse it
        assert methods.takes(loss, flag) and not methods.takes("simcse", flag)


def test_each_new_method_trains_end_to_end_with_its_recipe(world):
    gen = generator_folder(world)
    for loss in NEW:
        extra = ["--generator", str(gen)] if loss == "diffcse" else []
        result = run(world, "--loss", loss, "--max-steps", "2", "--overwrite", *extra)
        assert result["steps"] == 2 and all(math.isfinite(v) for _, v in result["losses"])
        assert train.checkpoint.read_metadata(world["out"])["method"] == loss
    for loss, want in (("esimcse", (0.05, 64, 32, 3e-5, "cls", "cls")), ("sscl", (0.05, 64, 32, 3e-5, "mean", "mean")),
                       ("diffcse", (0.05, 64, 32, 7e-6, "cls", "cls")), ("sg-opt-sscl", (0.01, 16, 128, 5e-5, "cls", "cls"))):
        c = methods.resolve_config(train.get_args(["--loss", loss]))
        assert (c.tau, c.batch_size, c.max_len, c.lr, c.pooling, c.eval_pooling) == want, loss
    c = methods.resolve_config(train.get_args(["--loss", "esimcse"]))
    assert (c.dup_rate, c.queue_size, c.momentum) == (0.32, 160, 0.995)  # ESimCSE/run.sh for bert-base-uncased
    assert methods.resolve_config(train.get_args(["--loss", "sscl"])).neg_layers == 2  # --hard_negative_layers
