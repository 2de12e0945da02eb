"""Where the time of the bench's two missed targets goes: torch.profiler's operators by self time.

    SG_DATA=path/to/data python results/bench/core2/ops.py > results/bench/core2/ops.txt

1. The encoder at 16 x 128 (no padding), ours against transformers' BertModel (sdpa): both run the same GEMMs.
2. This machine's fp32 GEMM rate at the encoder's shapes: torch.addmm, MKL's packed GEMM and oneDNN's.
3. SG-OPT's step as lab.bench times it (batch 16 of STS-B, MiniLM, dropout on): what is not a GEMM.
"""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import torch
import torch.nn.functional as F
from torch.profiler import profile

import bert
from lab import cpu, reference
from lab.benchmarks.common import minilm_path, time_alternating
from lab.benchmarks.encoder import random_batch
from lab.benchmarks.step import make_step_run

print(cpu.cpu_kind(), torch.backends.cpu.get_cpu_capability(), torch.__version__,
      "threads", torch.get_num_threads(), "fp32")


def table(fn, runs, rows=8):
    fn(), fn()
    with profile() as p:
        for _ in range(runs):
            fn()
    ev = sorted(p.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in ev)
    print(f"  total {total / 1e3 / runs:.1f} ms a call")
    for e in ev[:rows]:
        print(f"  {e.key:58s} {100 * e.self_cpu_time_total / total:5.1f}%  "
              f"{e.self_cpu_time_total / 1e3 / runs:7.1f} ms  {e.count // runs:4d} calls")


path = minilm_path()
ours = bert.Bert.from_pretrained(path).eval()
ref = reference.hf_bert(path, "cpu").eval()
ids, mask = random_batch(16, 128, ours.config.vocab_size, False)
print("\n1. encoder, 16 x 128, inference_mode: ours")
with torch.inference_mode():
    table(lambda: ours(ids, mask), 5)
    print("   transformers BertModel (sdpa)")
    table(lambda: ref(input_ids=ids, attention_mask=mask, output_hidden_states=True), 5)


print("\n2. fp32 GEMM at the encoder's shapes (2048 tokens), median of 30 alternating: GFLOP/s")
torch.manual_seed(0)
with torch.inference_mode():
    for M, K, N, what in [(2048, 384, 1152, "q, k, v"), (2048, 384, 1536, "ffn in"),
                          (2048, 1536, 384, "ffn out"), (2048, 384, 384, "attn out")]:
        x, w, b = torch.randn(M, K), torch.randn(N, K), torch.randn(N)
        packed = torch.ops.mkl._mkl_reorder_linear_weight(w, M)
        fns = {"F.linear": lambda: F.linear(x, w, b),
               "mkl packed": lambda: torch.ops.mkl._mkl_linear(x, packed, w, b, M),
               "onednn": lambda: torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")}
        rates = {k: 2 * M * K * N / s / 1e9 for k, s in time_alternating(fns, 30, 3).items()}
        print(f"  {what:9s} {M}x{K}x{N}: " + "  ".join(f"{k} {v:.0f}" for k, v in rates.items()))

data_dir = os.environ.get("SG_DATA")
if data_dir:
    print("\n3. SG-OPT step (lab.bench's: batch 16 of STS-B, MiniLM, dropout on)")
    run = make_step_run("sgbert", path=path, data_dir=data_dir, batch_size=16)
    table(run, 8, rows=12)
