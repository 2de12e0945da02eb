"""The CUDA path against the CPU path: the encoder, the loss, a training run (fp32 and bf16 autocast) and the
evaluation on a GPU compute what they compute on the CPU. Skipped where torch sees no CUDA device (CI); run with
a GPU visible, the whole suite exercises these too (tests/test_distributed.py covers the CPU side of bf16)."""
import pytest
import torch

import bert
import checkpoint
import evaluate
import sg_loss
from test_distributed import no_dropout
from test_train import run, world  # noqa: F401 (the tiny model, data folder and sentences)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch")


def test_encoder_on_cuda_equals_cpu(tiny_config):
    torch.manual_seed(0)
    m = bert.Bert(bert.BertConfig(**tiny_config)).eval()
    ids = torch.randint(5, tiny_config["vocab_size"], (4, 12))
    mask = (torch.arange(12)[None] < torch.tensor([[12], [7], [3], [9]])).long()
    cpu = m(ids, mask)
    gpu = m.cuda()(ids.cuda(), mask.cuda())
    for k, (a, b) in enumerate(zip(cpu, gpu)):
        torch.testing.assert_close(b.cpu(), a, rtol=1e-4, atol=1e-4, msg=f"hidden state {k}")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        half = m(ids.cuda(), mask.cuda())[-1].float().cpu()
    real = mask.bool()
    assert (half[real] - cpu[-1][real]).abs().max() < 0.1 * cpu[-1][real].abs().max()


def test_sg_opt_on_cuda_equals_the_cpu_float64_loss():
    torch.manual_seed(0)
    c, h = torch.randn(16, 32, dtype=torch.float64), torch.randn(16, 7, 32, dtype=torch.float64)
    want = sg_loss.sg_opt(c, h, 0.01)
    got = sg_loss.sg_opt(c.float().cuda(), h.float().cuda(), 0.01)
    assert got.dtype == torch.float32 and abs(got.item() - want.item()) <= 1e-4 * abs(want.item())


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_training_on_cuda(world, precision):
    """A run on the GPU trains (finite losses, weights move), writes a checkpoint that loads on the CPU, and its first
    loss equals the CPU run's (fp32: 1e-4; bf16 autocast: 2e-2)."""
    no_dropout(world)
    flags = ["--teacher-dropout", "off", "--lr", "1e-3", "--max-steps", "4"]
    cpu = run(world, *flags)
    gpu = run(world, *flags, "--overwrite", "--device", "cuda", "--precision", precision)
    assert all(torch.isfinite(torch.tensor(l)) for _, l in gpu["losses"])
    tol = 1e-4 if precision == "fp32" else 2e-2
    assert abs(gpu["losses"][0][1] - cpu["losses"][0][1]) <= tol * max(1.0, abs(cpu["losses"][0][1]))
    meta = checkpoint.read_metadata(world["out"])
    assert meta["args"]["precision"] == precision and meta["args"]["device"] == "cuda"
    m, tok = bert.Bert.from_pretrained(world["out"]), bert.load_tokenizer(world["out"])  # on the CPU
    assert evaluate.stsb_spearman(evaluate.sentence_vectors(m, tok), world["data"], "dev") == pytest.approx(gpu["dev"], abs=1e-2)


def test_evaluation_on_cuda_equals_cpu(world):
    m, tok = bert.Bert.from_pretrained(world["model"]).eval(), bert.load_tokenizer(world["model"])
    for pooling in ("cls", "mean"):
        cpu = evaluate.stsb_spearman(evaluate.sentence_vectors(m, tok, pooling), world["data"], "dev")
        gpu = evaluate.stsb_spearman(evaluate.sentence_vectors(m.cuda(), tok, pooling), world["data"], "dev")
        m.cpu()
        assert gpu == pytest.approx(cpu, abs=1e-3)
