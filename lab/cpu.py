"""
Whether --precision bf16 pays on this CPU: its bf16 matrix products measured against fp32's, and the one note a bf16
run prints where it will not (lab.train, lab.evaluate, lab.pretrain). The CPU's kind is cli.cpu_kind.
"""
import sys

import cli


def bf16_matmul_speedup(n=1024, repeats=3):
    """How much faster a bf16 matrix product runs than an fp32 one on this CPU, measured now (the
    best of `repeats` n^3 torch.matmul each, a few ms): what --precision bf16 can gain, since bf16
    instructions alone do not make it fast. Only a note depends on it, never a number."""
    import time
    import torch
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=gen), torch.randn(n, n, generator=gen)
    best = {}
    for dtype in (torch.float32, torch.bfloat16):
        x, y = a.to(dtype), b.to(dtype)
        x @ y  # warm-up: oneDNN builds its kernel on the first call
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            x @ y
            times.append(time.perf_counter() - t)
        best[dtype] = min(times)
    return best[torch.float32] / best[torch.bfloat16]


def warn_slow_bf16(precision, device):
    """One stderr line when bf16 is asked for on a CPU where it will not beat fp32: without a bf16
    unit (its products emulated: runtime.Bf16Products), or with one whose bf16 products measure
    under x1.5 of fp32's (bf16_matmul_speedup), since the casts around them eat the rest."""
    if precision != "bf16" or device != "cpu":
        return
    kind = cli.cpu_kind()
    if not kind["bf16_unit"]:
        print(f"note: --precision bf16 on a CPU without bf16 matrix instructions ({kind['model']}, "
              f"{kind['capability']}): its matrix products are emulated in fp32 (a bf16 unit's "
              "numbers, at about fp32's speed, not faster); bf16 pays only on a CPU with "
              "AVX512-BF16 or AMX, or a GPU", file=sys.stderr)
        return
    speedup = bf16_matmul_speedup()
    if speedup < 1.5:
        pace = "slower than" if speedup < 1 else "about as fast as"
        print(f"note: --precision bf16 on this CPU ({kind['model']}, {kind['capability']}): its bf16 matrix products "
              f"run at x{speedup:.2f} of fp32's (1024^3 torch.matmul, measured now), so bf16 will be {pace} fp32 "
              "here (fp32 is the exact precision); bf16 pays on a CPU whose bf16 products are several times fp32's "
              "(AMX; some AVX512-BF16 CPUs) or a GPU", file=sys.stderr)
