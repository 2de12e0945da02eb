"""
Whether --precision bf16 pays on this CPU: its bf16 matrix products measured against fp32's, and the one note a bf16
run prints where it will not (lab.train, lab.evaluate, lab.pretrain), and the CPU's kind (cpu_kind).
"""
import sys

import cli


def cpu_kind():
    """What a speed figure or a bf16 run depends on, the CPU kind a pretraining's bytes are promised
    for: {'model': the CPU's name, 'capability': torch's vector ISA, 'bf16_unit': whether oneDNN
    finds bf16 matrix instructions (cli.bf16_unit), 'amx': the amx_tile, amx_bf16 flags of
    /proc/cpuinfo (False off Linux), 'family_model': its "cpu family/model" (e.g. "6/207", else None),
    which tells apart CPUs that share a name}."""
    import platform
    import torch
    info = cpuinfo()
    family, number = info.get("cpu family"), info.get("model")
    return {"model": info.get("model name") or platform.processor() or platform.machine(),
            "capability": torch.backends.cpu.get_cpu_capability(), "bf16_unit": cli.bf16_unit(),
            "amx": {"amx_tile", "amx_bf16"} <= set(info.get("flags", "").split()),
            "family_model": f"{family}/{number}" if family and number else None}


def cpuinfo(path="/proc/cpuinfo"):
    """The first processor's 'key: value' lines of /proc/cpuinfo as a dict ({} where none)."""
    out = {}
    try:
        with open(path) as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block ends at its blank line
                key, _, value = line.partition(":")
                out.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return out


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
    kind = cpu_kind()
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
