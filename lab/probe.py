"""
How far BERT's dropout moves a model's sentence vectors: a diagnosis for models pretrained with dropout off
(pretrain.py's default, after Cramming), which meet BERT's dropout 0.1 for the first time when they are fine-tuned.
SimCSE's positive pair is two dropout draws of one sentence, and SG-OPT trains BERT_T (and, in the official code's
default, makes BERT_F's views) with dropout on, so a model that dropout scatters gives them noise to learn from.

    python -m lab.probe --model raw-bert-mini --json results/raw/dropout/raw-bert-mini.json

On the STS-B dev sentences, for each pooling (cls, mean; the last layer), over --draws seeded dropout draws:
- on_off: the cosine of a sentence's vector made with dropout on (train mode) and made with it off (eval mode);
- two_draws: the cosine of two dropout draws of the same sentence (SimCSE's positive pair);
- other: the cosine of two different sentences, dropout off (the scale of the negatives), for reference;
- dev_off, dev_on: STS-B dev Spearman x100 of the vectors made with dropout off, and with it on (mean over draws).
"""
import argparse
import os
import sys
from pathlib import Path

import cli

if __name__ == "__main__":
    cli.exit_on_ctrl_c("probe.py")

def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip())
    p.error = cli.die
    p.add_argument("--model", required=True, help="a folder, a .safetensors checkpoint or a name in weights/")
    p.add_argument("--data-dir", help="data folder (default $SG_DATA, else ./data)")
    p.add_argument("--draws", type=cli.at_least(2), default=4, help="dropout draws (default %(default)s)")
    p.add_argument("--seed", type=cli.seed_value, default=1, help="the draws' seed (default %(default)s)")
    p.add_argument("--threads", type=cli.at_least(1), help="torch CPU threads (default: torch's)")
    p.add_argument("--json", help="write the numbers here")
    return p.parse_args(argv)


if __name__ == "__main__":
    get_args()  # exits here on --help or a bad flag, before torch loads

import numpy as np
import torch

import bert
import checkpoint
import evaluate
import outputs
from checkpoint import LoadError
from data import DataError, load_stsb, resolve_data_dir

PROBED_POOLINGS = ("cls", "mean")


def stats(c):
    """Summary of per-sentence cosines: mean, 5th percentile, min."""
    return {"mean": float(c.mean()), "p5": float(np.percentile(c, 5)), "min": float(c.min())}


def probe(model, tokenizer, s1, s2, gold, draws, seed):
    """The numbers of the docstring, for each pooling: {pooling: {...}}."""
    uniq, index = evaluate.unique_sentences([(s1, s2, gold)])
    specs = [(p, -1) for p in PROBED_POOLINGS]
    off = bert.encode_many(model, tokenizer, uniq, specs)
    on = []
    for k in range(draws):
        torch.manual_seed(seed * 1_000_003 + k)  # each draw's dropout masks
        on.append(bert.encode_many(model, tokenizer, uniq, specs, dropout=True))
    other = np.random.default_rng(0).permutation(len(uniq))  # each sentence against another one
    out = {}
    for spec in specs:
        x = off[spec]
        dev_on = [evaluate.spearman(evaluate.similarities(d[spec], index, s1, s2), gold) for d in on]
        out[spec[0]] = {
            "on_off": stats(np.concatenate([evaluate.cosine(d[spec], x) for d in on])),
            "two_draws": stats(np.concatenate([evaluate.cosine(on[k][spec], on[k + 1][spec]) for k in range(draws - 1)])),
            "other": stats(evaluate.cosine(x, x[other])),
            "dev_off": evaluate.spearman(evaluate.similarities(x, index, s1, s2), gold),
            "dev_on": float(np.mean(dev_on)), "dev_on_std": float(np.std(dev_on))}
    return out


def check_json(path, model):
    """--json before any work: a .json file name in a folder we can write to, and neither one of the model's files
    nor a file inside its folder (the record over its config.json would leave a model that no longer loads)."""
    try:
        outputs.check_output(path, ".json")
    except outputs.OutputError as e:
        cli.die(f"--json {e}")
    source = checkpoint.local_path(model)  # as checkpoint.resolve finds it
    try:
        files = [*source.iterdir()] if source.is_dir() else []  # by inode too: a hard link to its config.json
    except OSError:
        files = []  # an unreadable folder: loading the model names it
    if any(outputs.same_path(path, f) for f in (source, *files)) or any(
            outputs.same_path(source, d) for d in Path(os.path.realpath(path)).parents):
        cli.die(f"--json {path} is one of the files of the model {model} or inside its folder: writing it would "
                "replace what the model is made of; give another file")


def main(argv=None):
    args = get_args(argv)
    if args.json:
        check_json(args.json, args.model)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        data_dir = resolve_data_dir(args.data_dir, fetch=False)
        s1, s2, gold = load_stsb("dev", data_dir)
        model = bert.Bert.from_pretrained(args.model)  # the encoder alone: a checkpoint's fitted map is not probed
        tokenizer = evaluate.eval_tokenizer(bert.load_tokenizer(args.model), model.config)
    except (DataError, LoadError) as e:
        cli.die(e)
    p = model.config.hidden_dropout_prob
    if p == 0:
        cli.die(f"{args.model}: its config has dropout 0, so dropout cannot move its vectors; nothing to probe")
    result = probe(model, tokenizer, s1, s2, gold, args.draws, args.seed)
    print(f"{checkpoint.display_name(args.model)} | dropout {p} | {len(set(s1 + s2))} STS-B dev sentences | "
          f"{args.draws} draws")
    print("pooling | cos(on, off) mean / p5 | cos(two draws) mean / p5 | cos(other sentence) | dev off | dev on")
    for name, r in result.items():
        print(f"{name:7} | {r['on_off']['mean']:.4f} / {r['on_off']['p5']:.4f} | {r['two_draws']['mean']:.4f} / "
              f"{r['two_draws']['p5']:.4f} | {r['other']['mean']:.4f} | {r['dev_off']:.2f} | "
              f"{r['dev_on']:.2f} +- {r['dev_on_std']:.2f}")
    if args.json:
        record = {"model": checkpoint.display_name(args.model), "sha256": checkpoint.weights_sha256(args.model),
                  "dropout": p, "draws": args.draws, "seed": args.seed, "sentences": len(set(s1 + s2)),
                  "git": cli.git_sha(), "command": "python -m lab.probe " + " ".join(sys.argv[1:]), **result}
        try:
            outputs.write_json(args.json, record)
        except OSError as e:
            cli.die(f"cannot write {args.json} ({e.strerror or e})", code=1)
    return result


if __name__ == "__main__":
    cli.run(main, "probe.py")
