"""
Two tiny training runs (SG-OPT and SimCSE: a 2-layer random BERT, 8 steps, one thread) in this checkout and in
another commit's, their checkpoints compared tensor by tensor: the proof that a refactor moved code without
changing a number. Both trees run on this machine, so a bit-for-bit answer is expected.

    python -m lab.tiny_runs --against 18a0529    # the commit before the core / lab split

The other commit is checked out with `git worktree add` into a temporary folder (removed after).
"""
import argparse
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import cli

ROOT = Path(__file__).resolve().parents[1]
WORDS = "a man woman dog cat is are playing eating running guitar food in the park on street with".split()
CONFIG = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
              max_position_embeddings=64, type_vocab_size=2, layer_norm_eps=1e-12, pad_token_id=0)
RUNS = {"opt": ["--proj-size", "16"], "simcse": []}


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip(),
                                epilog="example: python -m lab.tiny_runs --against 18a0529")
    p.error = cli.die
    p.add_argument("--against", required=True, help="the commit to compare with (any git revision)")
    return p.parse_args(argv)


def world(folder):
    """A tiny random model folder, a data folder with a small STS-B, and 40 training sentences."""
    import torch
    from safetensors.torch import save_file

    import bert
    rng = random.Random(0)
    model_dir = folder / "tiny"
    model_dir.mkdir(parents=True)
    torch.manual_seed(0)
    save_file({k: v.contiguous() for k, v in bert.Bert(bert.BertConfig(**CONFIG)).state_dict().items()},
              str(model_dir / "model.safetensors"))
    (model_dir / "config.json").write_text(json.dumps(CONFIG))
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *WORDS]
    (model_dir / "vocab.txt").write_text("\n".join(vocab) + "\n")

    def sentence():
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9))) + " ."
    sts = folder / "data/senteval/STS/STSBenchmark"
    sts.mkdir(parents=True)
    for split in ("dev", "test"):
        rows = [f"main-captions\tMSRvid\t2012test\t{i:04d}\t{rng.uniform(0, 5):.3f}\t{sentence()}\t{sentence()}"
                for i in range(30)]
        (sts / f"sts-{split}.csv").write_text("\n".join(rows) + "\n")
    with gzip.open(folder / "data/stsbenchmark.tsv.gz", "wt") as f:
        f.write("split\tgenre\tdataset\tyear\tsid\tscore\tsentence1\tsentence2\n")
    (folder / "sents.txt").write_text("\n".join(sentence() for _ in range(40)) + "\n")
    return model_dir


def entry(tree, loss):
    """What trains `loss` in `tree`: its train.py, or for a lab method its lab/train.py where it has one."""
    if loss != "opt" and (tree / "lab" / "train.py").is_file():
        return ["-m", "lab.train"]
    return [str(tree / "train.py")]


def train(tree, folder, model_dir, loss):
    """train.py (or the lab's trainer) of `tree` on the tiny world, one thread: the checkpoint's path."""
    out = folder / f"{tree.name}-{loss}.safetensors"
    cmd = [sys.executable, *entry(tree, loss), "--model", str(model_dir), "--loss", loss, "--data",
           str(folder / "sents.txt"), "--data-dir", str(folder / "data"), "--out", str(out), "--batch-size", "4",
           "--max-steps", "8", "--eval-every", "3", "--lr", "1e-3", "--device", "cpu", *RUNS[loss]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(tree)}
    r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if r.returncode:
        cli.die(f"{tree.name}: {Path(cmd[1]).name if cmd[1] != '-m' else cmd[2]} --loss {loss} failed "
                f"(exit {r.returncode}): {r.stderr.strip()[-300:]}")
    return out


def main(argv=None):
    args = get_args(argv)
    from safetensors.torch import load_file
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        other = tmp / "other"
        r = subprocess.run(["git", "worktree", "add", "--detach", str(other), args.against], cwd=ROOT,
                           capture_output=True, text=True)
        if r.returncode:
            cli.die(f"--against {args.against}: git worktree add failed: {r.stderr.strip()}")
        try:
            model_dir, same = world(tmp / "world"), True
            for loss in RUNS:
                a, b = (load_file(str(train(t, tmp / "world", model_dir, loss))) for t in (ROOT, other))
                equal = a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
                print(f"--loss {loss}: {len(a)} tensors, {'bit-identical' if equal else 'DIFFERENT'}")
                same &= equal
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(other)], cwd=ROOT, capture_output=True)
    print("same tensors as " + args.against if same else f"the runs differ from {args.against}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(cli.run(main, "lab/tiny_runs.py") or 0)
