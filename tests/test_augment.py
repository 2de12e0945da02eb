"""augment.py: each ConSERT augmentation does exactly what it says on a hand-made embedding output."""
import pytest
import torch

from lab import augment


def batch(lengths, T, H=10):
    mask = torch.tensor([[1] * n + [0] * (T - n) for n in lengths])
    return torch.ones(len(lengths), T, H), mask


@pytest.mark.parametrize("kind, rate", [("token-cutoff", 0.3), ("feature-cutoff", 0.2), ("dropout", 0.25)])
def test_cutoffs_zero_exactly_what_they_say(kind, rate):
    x, mask = batch([7, 4, 2], T=7)
    out = augment.parse(f"{kind}:{rate}").embedding_fn(mask, torch.Generator().manual_seed(0))(x)
    mask_before = mask.clone()
    for i, n in enumerate([7, 4, 2]):
        real, pad = out[i, :n], out[i, n:]
        assert torch.all(pad == 1), "a [PAD] position was touched"
        zero = real == 0
        if kind == "token-cutoff":  # whole rows, int(n * r) of them
            rows = zero.all(1)
            assert rows.sum() == int(n * rate) and torch.equal(zero, rows[:, None].expand_as(zero))
        elif kind == "feature-cutoff":  # whole columns over the real tokens, int(H * r) of them
            cols = zero.all(0)
            assert cols.sum() == int(10 * rate) and torch.equal(zero, cols[None].expand_as(zero))
        else:  # single elements, int(n * H * r) of them
            assert zero.sum() == int(n * 10 * rate)
    assert torch.equal(mask, mask_before)
    assert set(out.unique().tolist()) <= {0.0, 1.0}, "no rescaling"


def test_shuffle_permutes_only_the_real_positions():
    x, mask = batch([5, 3], T=6)
    aug = augment.parse("shuffle")
    assert aug.embedding_fn(mask, torch.Generator()) is None
    pos = aug.position_ids(mask, torch.Generator().manual_seed(1))
    for i, n in enumerate([5, 3]):
        assert sorted(pos[i, :n].tolist()) == list(range(n))  # [CLS] and [SEP] included
        assert pos[i, n:].tolist() == list(range(n, 6))
    seen = {tuple(aug.position_ids(mask, torch.Generator().manual_seed(s))[0].tolist()) for s in range(10)}
    assert len(seen) > 1, "not random"


@pytest.mark.parametrize("spec", ["shuffle", "token-cutoff:0.5", "feature-cutoff:0.2", "dropout:0.3"])
def test_the_same_sentence_at_another_batch_length_gets_the_same_treatment(spec):
    aug = augment.parse(spec)
    results = []
    for T in (4, 9):
        x, mask = batch([4, 3], T=T)
        g = torch.Generator().manual_seed(3)
        if spec == "shuffle":
            results.append(aug.position_ids(mask, g)[:, :4] * mask[:, :4])
        else:
            results.append(aug.embedding_fn(mask, g)(x)[:, :4])
    assert torch.equal(*results)


def test_gradients_flow_through_the_kept_entries():
    x, mask = batch([3], T=3)
    x.requires_grad_(True)
    augment.parse("feature-cutoff:0.5").embedding_fn(mask, torch.Generator())(x).sum().backward()
    assert torch.equal(x.grad, (x.grad != 0).float()) and x.grad.sum() == 3 * 5


@pytest.mark.parametrize("spec, message", [
    ("cutout:0.1", "unknown augmentation"), ("token-cutoff", "expected token-cutoff:RATE"),
    ("dropout:1.5", "rate must be in (0, 1)"), ("shuffle:0.1", "takes no rate"), ("feature-cutoff:x", "expected"),
])
def test_bad_specs(spec, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        augment.parse(spec)
