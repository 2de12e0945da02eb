"""Data-parallel training (torch.distributed, gloo, CPU): 2 processes with a global batch of 8 are the same run as
1 process with a batch of 8; bad splits are refused; a killed rank ends the run; bf16 autocast trains on the CPU."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import bert
import checkpoint
import train
from lab import train as lab_train
from lab import methods
from test_train import run, small_head, world  # noqa: F401 (the tiny model, data folder and sentences)

ROOT = Path(train.__file__).resolve().parent


def no_dropout(world):
    cfg = json.loads((world["model"] / "config.json").read_text())
    (world["model"] / "config.json").write_text(json.dumps(dict(cfg, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)))


def argv(world, out, *flags):
    return ["--model", str(world["model"]), "--data", str(world["sents"]), "--data-dir", str(world["data"]),
            "--out", str(out), *small_head(flags), "--device", "cpu",
            "--log-every", "1", *flags]


def entry(flags):
    """train.py for the SG family, python -m lab.train (from the root) for the lab's methods."""
    loss = flags[flags.index("--loss") + 1] if "--loss" in flags else "opt"
    return [str(ROOT / "train.py")] if loss in train.LOSSES else ["-m", "lab.train"]


def trainer(flags):
    """The main() that trains these flags in this process: train.py's or the lab's."""
    return train.main if entry(flags)[0] != "-m" else lab_train.main


def torchrun(world, out, flags, n=2, **kw):
    """torchrun --standalone: its agent picks a free port and hosts the store itself (no port race between tests)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(n),
           *entry(flags), *argv(world, out, *flags)]
    return subprocess.Popen(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), text=True, cwd=ROOT, **kw)


def launch(world, out, flags, n=2):
    """-> (exit code, stdout, stderr) of a torchrun of n processes; stdout is every rank's, so rank 0's log alone.
    A run that hangs is killed with its ranks, and its output is in the failure message."""
    p = torchrun(world, out, flags, n, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        kill_tree(p.pid)  # torchrun and its ranks (which hold the pipes open)
        stdout, stderr = p.communicate()
        pytest.fail(f"torchrun did not finish in 240 s\n--- stdout\n{stdout}\n--- stderr\n{stderr}")
    return p.returncode, stdout, stderr


# sg, simcse: negatives that carry a gradient (c_j); esimcse: a queue of 12 (a batch and a half), gathered before it
# is queued, and the repetition's draws; sscl, sg-opt-sscl: BERT_T's lower layers, gathered; diffcse: its masks,
# padding and its discriminator's gradients (--no-proj: its BatchNorm head's statistics are each process's own)
OWN = {"esimcse": ["--queue-size", "12"], "diffcse": ["--no-proj", "--rtd-weight", "1"], "sscl": [], "sg-opt-sscl": []}


@pytest.mark.parametrize("loss", ["opt", "sg", "simcse", *OWN])
def test_two_processes_equal_one(world, loss):
    no_dropout(world)
    flags = ["--loss", loss, "--batch-size", "8", "--max-steps", "4", "--eval-every", "2", "--lr", "1e-3",
             "--dropout", "off", "--max-len", "16", *(["--teacher-dropout", "off"] if methods.takes(loss, "layers") else []),
             *OWN.get(loss, [])]
    if loss == "diffcse":
        from test_later_methods import generator_folder
        flags += ["--generator", str(generator_folder(world))]
    one = trainer(flags)(argv(world, world["tmp"] / "one.safetensors", *flags))
    out = world["tmp"] / "two.safetensors"
    rc, stdout, stderr = launch(world, out, [*flags, "--json", str(world["tmp"] / "two.json")])
    assert rc == 0, stderr
    assert stdout.count("sgbert ") == 1 and "x 2 processes" in stdout, stdout  # one log: rank 0's
    two = json.loads((world["tmp"] / "two.json").read_text())
    assert [s for s, _ in two["losses"]] == [1, 2, 3, 4]
    for (_, a), (_, b) in zip(one["losses"], two["losses"]):
        assert abs(a - b) <= 1e-5 * max(1, abs(a)), (one["losses"], two["losses"])
    assert two["best_step"] == one["best_step"]
    # (!!) Not fp32 rounding of the weights: Adam divides each gradient by its running RMS (+ eps 1e-6), so where a
    # gradient is near eps, the rounding difference of a batch summed as 4 + 4 (two processes) instead of 8 becomes a
    # step difference of up to a few % of lr (measured: 1.06e-5 on a LayerNorm bias, 1 thread). The bound is 1% of
    # the farthest Adam moves a weight, --max-steps x --lr; a gradient lost between ranks moves weights by whole
    # steps of lr (and shows in the losses above).
    atol = 0.01 * 4 * 1e-3
    a, b = bert.Bert.from_pretrained(world["tmp"] / "one.safetensors"), bert.Bert.from_pretrained(out)
    for (k, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(y, x, rtol=1e-5, atol=atol, msg=k)


def test_a_batch_that_does_not_divide_is_refused(world):
    out = world["tmp"] / "x.safetensors"
    env = dict(os.environ, WORLD_SIZE="2", RANK="0", LOCAL_RANK="0")
    p = subprocess.run([sys.executable, str(ROOT / "train.py"), *argv(world, out, "--batch-size", "7")], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0, p.stderr
    assert "--batch-size 7 does not divide over 2 processes" in p.stderr and not out.exists()


def children(pid):
    """The pids whose parent is pid (from /proc: Linux)."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def kill_tree(pid):
    """SIGKILL pid and every process below it (torchrun starts its ranks in sessions of their own)."""
    tree, i = [pid], 0
    while i < len(tree):
        tree += children(tree[i])
        i += 1
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_killing_one_rank_ends_the_run_without_a_broken_checkpoint(world):
    """Under torchrun: rank 1 is killed mid-run; torchrun stops rank 0; --out is absent or a whole checkpoint."""
    out = world["tmp"] / "k.safetensors"
    p = torchrun(world, out, ["--batch-size", "4", "--max-steps", "100000", "--eval-every", "5"],
                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        log = ""
        for line in p.stdout:  # rank 0's log: wait until training runs
            log += line
            if "step 12/" in line:
                break
        ranks = {}
        for pid in children(p.pid):
            env = dict(kv.split("=", 1) for kv in open(f"/proc/{pid}/environ").read().split("\0") if "=" in kv)
            ranks[env.get("RANK")] = pid
        assert set(ranks) == {"0", "1"}, (ranks, log)
        os.kill(ranks["1"], signal.SIGKILL)
        p.stdout.read()
        assert p.wait(timeout=120) != 0
    finally:
        if p.poll() is None:
            kill_tree(p.pid)
    for pid in ranks.values():  # no orphan left running
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    if out.exists():
        m = bert.Bert.from_pretrained(out)  # a whole checkpoint: it loads, with the run's metadata
        assert checkpoint.read_metadata(out)["best"]["step"] >= 0 and m.config.hidden_size == 32


def test_bf16_on_cpu_trains_close_to_fp32(world):
    no_dropout(world)
    flags = ["--teacher-dropout", "off", "--lr", "1e-3", "--max-steps", "6"]
    fp32 = run(world, *flags)["losses"]
    bf16 = run(world, *flags, "--precision", "bf16", "--overwrite")
    assert bf16["steps"] == 6 and all(map(torch.isfinite, torch.tensor([l for _, l in bf16["losses"]])))
    assert checkpoint.read_metadata(world["out"])["args"]["precision"] == "bf16"
    assert abs(bf16["losses"][0][1] - fp32[0][1]) <= 2e-2, (bf16["losses"][0], fp32[0])
    assert bf16["losses"] != fp32  # autocast was on


def test_more_processes_than_gpus_is_refused(world, monkeypatch, capsys):
    """The CUDA branch of init_distributed on a CPU machine (CUDA faked as present with 1 GPU): rank 1 wants GPU 1."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for k, v in dict(WORLD_SIZE="2", RANK="1", LOCAL_RANK="1").items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SystemExit) as e:
        train.main(argv(world, world["tmp"] / "g.safetensors", "--batch-size", "4", "--device", "cuda"))
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert "process 1 wants GPU 1 but 1 are visible" in err and "--nproc_per_node" in err
