"""bench.py's sections, one file per area; bench.py (the entry point: flags, the table of sections, main) imports
them, they import the top-level modules, and no top-level module imports them.

    common.py     the shared rules and helpers: time_alternating, peak_rss_mb / peak_cuda_mb, skip, verdict, the
                  device, the packaged model, step_setting, the --json record
    loss.py       loss
    encoder.py    encoder
    step.py       step, memory, ddp (train.py's SG-OPT step vs the reference step)
    precision.py  precision, mlm-precision (bf16 vs fp32: train.py's step, bert.encode, pretrain.py's step)
    sts.py        sts, wk
    transfer.py   transfer (evaluate.py's SentEval protocol vs SentEval itself)
    epoch.py      epoch (the paper's Table 6 training time)
    pretrain.py   pretrain, allocator (pretrain.py's masked-LM step)
    compile.py    compile (torch.compile vs eager)
    gpu.py        gpu (every GPU check in one command)
    profile.py    profile (torch.profiler's top operators of fp32 and bf16 steps, by name)
"""
