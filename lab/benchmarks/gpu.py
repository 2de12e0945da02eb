"""bench.py gpu: every GPU check of the project in one command (a GPU machine is lent to few sessions, for little time):
tests/test_cuda.py, the encoder, step, precision, pretrain and compile sections on cuda, the bert-base-shaped epoch in
fp32 and bf16, MiniLM SG-OPT fp32 vs bf16 (7 tasks); the record in results/gpu/ after every check."""
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

import data
import outputs
from lab.benchmarks.common import ROOT, step_setting
from lab.benchmarks.compile import bench_compile
from lab.benchmarks.encoder import bench_encoder
from lab.benchmarks.epoch import bench_epoch
from lab.benchmarks.precision import bench_precision
from lab.benchmarks.pretrain import bench_pretrain
from lab.benchmarks.step import bench_step


GPU_RECORDS = ROOT / "results" / "gpu"
CHECKS = {"encoder": bench_encoder, "step": bench_step, "precision": bench_precision, "pretrain": bench_pretrain,
          "compile": bench_compile}  # the sections it runs on cuda


def bench_gpu(results, args):
    """On a CUDA machine, in about 10 minutes: tests/test_cuda.py; the encoder, step, precision and pretrain ratios on
    the GPU; the bert-base-shaped SG-OPT epoch in fp32 and in bf16 (the paper's 455 s on a Titan Xp); all-MiniLM-L6-v2
    trained with SG-OPT (seed 1, full recipe) in fp32 and in bf16, the 7-task table of each; last, torch.compile vs
    eager. Writes results/gpu/<device>-<date>.json with the device, torch and CUDA versions, after every check (a run
    stopped at a time limit keeps what it finished). Without CUDA: one line, nothing run."""
    if not torch.cuda.is_available():
        print("  no CUDA device visible to torch: the GPU checks need one, so nothing was run")
        results["gpu"] = None
        return
    import datetime
    root, t0 = ROOT, time.perf_counter()
    name = torch.cuda.get_device_name()
    gpu = dict(device=name, torch=torch.__version__, cuda=torch.version.cuda, date=datetime.date.today().isoformat())
    dest = GPU_RECORDS / f"{re.sub(r'[^A-Za-z0-9]+', '-', name).strip('-')}-{gpu['date']}.json"
    dest.parent.mkdir(parents=True, exist_ok=True)

    def keep():
        gpu["seconds"] = time.perf_counter() - t0
        outputs.write_json(dest, gpu)

    print(f"  {name} | torch {torch.__version__} | CUDA {torch.version.cuda} | record: {dest}")
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/test_cuda.py"], cwd=root, capture_output=True,
                       text=True)
    gpu["test_cuda"] = dict(exit=p.returncode, summary=(p.stdout.strip().splitlines() or ["(no output)"])[-1])
    print(f"  tests/test_cuda.py: {gpu['test_cuda']['summary']} (exit {p.returncode})")
    keep()
    args.device = "cuda"

    def section(name):
        print(f"  -- {name}")
        try:
            CHECKS[name](results, args)
            gpu[name] = results.get(name)
        except Exception as e:  # one failing check must not cost the others: the record names it
            gpu[name] = {"error": f"{type(e).__name__}: {e}"}
            print(f"  {name} failed: {gpu[name]['error']}")
        keep()
    for name in ("encoder", "step", "precision", "pretrain"):
        section(name)
    for precision in ("fp32", "bf16"):
        print(f"  -- epoch, {precision}")
        args.epoch_precision, args.epoch_steps = precision, 0
        bench_epoch(results, args)
        gpu[f"epoch_{precision}"] = results.pop("epoch", None)
        keep()
    path, data_dir, why = step_setting(args)
    gpu["minilm_sg_opt"] = {}
    for precision in ([] if why else ["fp32", "bf16"]):
        gpu["minilm_sg_opt"][precision] = run = minilm_sg_opt_on_cuda(path, data_dir, precision)
        print(f"  MiniLM SG-OPT seed 1, {precision}: 7-task avg {run['sts']['avg']} (exit {run['exit']}, "
              f"{run['wall_seconds'] or float('nan'):.0f} s)")
        keep()
    section("compile")  # last: its cold compilations take minutes, and the checks above matter more
    print(f"  all GPU checks in {gpu['seconds'] / 60:.1f} min; record: {dest}")
    results["gpu"] = gpu


def minilm_sg_opt_on_cuda(path, data_dir, precision):
    """train.py itself: all-MiniLM-L6-v2, SG-OPT's full recipe, seed 1, on CUDA in the precision, the 7-task table
    -> {exit, sts {task: all}, wall_seconds, best_step}."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        p = subprocess.run([sys.executable, str(ROOT / "train.py"), "--model", str(path),
                            "--data-dir", str(data_dir), "--device", "cuda", "--precision", precision, "--seed", "1",
                            "--eval-all", "--out", str(Path(tmp) / "r.safetensors"), "--json", str(out)],
                           capture_output=True, text=True)
        r = json.loads(out.read_text()) if p.returncode == 0 else {}
    return dict(exit=p.returncode, sts={t: get_all(r, t) for t in [*data.TASKS, "avg"]},
                wall_seconds=r.get("wall_seconds"), best_step=r.get("best_step"))


def get_all(result, task):
    x = (result.get("sts") or {}).get(task) or {}
    return x.get("all")
