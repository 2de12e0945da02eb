"""What oneDNN's fp32 GEMM would buy the encoder, and what it would change: not adopted (see README.md).

    SG_DATA=path/to/data python results/bench/core2/onednn.py > results/bench/core2/onednn.txt

torch's CPU F.linear runs MKL's sgemm. oneDNN's (torch.ops.mkldnn._linear_pointwise) is another kernel with
another order of the float sums, so its outputs differ in the last bits. Here: the encoder at 16 x 128 with each
kernel against transformers (alternated, median of 15 after 2), the largest difference of the hidden states, and the 7 STS
tasks' averages of two models with each kernel.
"""
import contextlib
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import torch
import torch.nn.functional as F

import bert
import data
import evaluate
import fast
from lab import cpu, reference
from lab.benchmarks.common import minilm_path, time_alternating
from lab.benchmarks.encoder import random_batch

print(cpu.cpu_kind(), torch.backends.cpu.get_cpu_capability(), torch.__version__,
      "threads", torch.get_num_threads(), "fp32")
mkl_linear = F.linear


def onednn_linear(x, w, b=None):
    if x.requires_grad or w.requires_grad or x.dtype != torch.float32:
        return mkl_linear(x, w, b)
    return torch.ops.mkldnn._linear_pointwise(x, w.contiguous(), b, "none", [], "")


@contextlib.contextmanager
def onednn():
    fast.F.linear = onednn_linear  # fast.linear's products, the only GEMMs of the forward
    try:
        yield
    finally:
        fast.F.linear = mkl_linear


path = minilm_path()
ours = bert.Bert.from_pretrained(path).eval()
ref = reference.hf_bert(path, "cpu").eval()
for B, T in [(16, 128), (64, 32)]:
    ids, mask = random_batch(B, T, ours.config.vocab_size, False)
    with torch.inference_mode():
        a = ours(ids, mask)
        with onednn():
            b = ours(ids, mask)
        diff = max((x - y).abs().max().item() for x, y in zip(a, b))
        def with_onednn():
            with onednn():
                return ours(ids, mask)
        fns = {"mkl": lambda: ours(ids, mask), "onednn": with_onednn, "transformers":
               lambda: ref(input_ids=ids, attention_mask=mask, output_hidden_states=True)}
        ms = {k: 1e3 * s for k, s in time_alternating(fns, 15, 2).items()}
    print(f"encoder {B} x {T}: ms " + ", ".join(f"{k} {v:.1f}" for k, v in ms.items())
          + f"; transformers / ours: mkl x{ms['transformers'] / ms['mkl']:.3f}, onednn "
          f"x{ms['transformers'] / ms['onednn']:.3f}; max |hidden mkl - onednn| {diff:.1e}")

data_dir = os.environ.get("SG_DATA")
if data_dir:
    for name in ("raw-bert-mini-5", path):
        model, tok = bert.Bert.from_pretrained(name), bert.load_tokenizer(name)
        tok = evaluate.eval_tokenizer(tok, model.config)
        for pooling in ("cls", "mean"):
            avg = {}
            for kernel in ("mkl", "onednn"):
                with onednn() if kernel == "onednn" else contextlib.nullcontext():
                    res = evaluate.evaluate_sts(evaluate.sentence_vectors(model, tok, pooling),
                                                data.TASKS, data_dir, log=lambda *a: None)
                avg[kernel] = res["avg"]["all"]
            print(f"{Path(str(name)).name} {pooling}: 7-task avg (all) mkl {avg['mkl']:.4f}, "
                  f"onednn {avg['onednn']:.4f}")
