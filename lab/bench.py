"""Side-by-side benchmarks of sgbert against its references: the entry point over benchmarks/, one file per area.

    SG_DATA=path/to/data python -m lab.bench [--json FILE] [--only SECTION,...] [--repeats 7] [--threads N]

One function per section, bench_<name>(results, args) in benchmarks/<area>.py: it prints its lines and fills
results[<name>]. A section whose reference (transformers, the packaged all-MiniLM-L6-v2, the data folder) is missing,
or whose data folder is too small for it, prints one line saying what is missing and is skipped, before any of its
work. The header names the machine and its CPU kind (cpu.cpu_kind), and warns in one line when other work loads it
(a 1-minute load average above half its CPUs), since the ratios then mean little. Shared rules
(benchmarks/common.py), so that ratios mean something:
- contenders run in one process, alternating run by run (a, b, a, b, ...), and each reports the median; on a
  shared machine a slow spell then hits every contender instead of one;
- peak memory on CPU is measured per contender in a fresh process (peak_rss_mb), on GPU with the CUDA allocator's
  peak (peak_cuda_mb);
- before anything is timed, the contenders are checked to compute the same numbers.

  loss      (benchmarks/loss.py) sg_opt (one (b, b*L) similarity matrix) vs the official code's formulation of the
            same L^opt3 (a loop over layers, per-layer (b, b) similarities, the negatives repeated for every layer)
  encoder   (encoder.py) bert.Bert vs transformers.BertModel (sdpa), forward, all-MiniLM-L6-v2, 64 x 32 and 16 x 128
  step      (step.py) one SG-OPT training step as train.py runs it vs the same step from transformers.BertModel with
            the official formulation of the loss and of the regulariser (a Python loop of per-parameter norms), and
            the step's achieved GFLOP/s against this machine's measured GEMM rate in the same precision
  precision (precision.py) the CPU's kind (cpu.cpu_kind: bf16 matrix unit or not), then our step in bf16 autocast vs
            fp32 on the same device, each against the fp32 reference step, encoding sentences/s in bf16 vs fp32
            (bert.encode), and with a bf16 unit the GEMM rates of fp32, bf16 and fp16 in the encoders' shapes
  ddp       (step.py) train.py itself: 1 process vs torchrun with 2 gloo processes on this CPU, the same global batch
  memory    (step.py) peak memory of a few of those steps, ours vs the reference
  sts       (sts.py) the 7-task STS encoding: length-sorted batches (bert.encode) vs unsorted batch-16 batches in input
            order, as SentEval's batcher receives them; and evaluate.py's way (each distinct sentence once, sorted)
  wk        (sts.py) WK pooling (wk.py: batched QR) vs mean pooling of the same model, STS-B test sentences (the
            paper's Table 6: WK at 14x mean pooling's time), and vs the SBERT-WK code's per-sentence, per-token numpy
            loop (reference.py)
  transfer  (transfer.py) the SentEval transfer tasks on the same all-MiniLM-L6-v2 vectors: evaluate.py's batched
            classifiers (on the run's threads, and on one) vs SentEval itself (a checkout named by SENTEVAL_DIR,
            adapted to a CPU at import; needs scikit-learn; --senteval-threads, default 1); time and the accuracy
            difference per task (--transfer-tasks, --transfer-config, --transfer-pooling, --transfer-skip-1thread)
  epoch     (epoch.py; by name only) train.py for one epoch of SG-OPT with a bert-base-shaped model of random weights,
            dev evaluations included: the paper's Table 6 (455 s on a Titan Xp); --epoch-steps N to cap and extrapolate
  pretrain  (pretrain.py) pretrain.py's masked-LM step (BERT-Mini, packed, decoder at the masked rows, fused AdamW) vs
            transformers' BertForMaskedLM + torch AdamW on the same batches and masks: tokens per second
  mlm-precision (precision.py) pretrain.py's step in fp32 and in bf16 autocast, sentence and packed batches, then the
            held-out MLM score after the same short run in each
  allocator (pretrain.py; by name only) pretrain.py's step at model 4's shape (256 sentences, dropout 0.1) under
            glibc's malloc and its alternatives (glibc without mmap and trim; jemalloc, default and never purging,
            where installed), each a fresh process (--alloc-steps steps, --repeats alternations): tokens/s, system
            time, page faults
  compile   (compile.py; by name only) torch.compile of the encoder's layers vs eager: STS-B encoding (varying
            shapes), a fixed shape, train.py's SG-OPT step, pretrain.py's step; compilation time and the calls it
            takes to pay back
  gpu       (gpu.py; by name only) every GPU check in one command: tests/test_cuda.py, encoder/step/precision/pretrain/
            compile on cuda, the bert-base-shaped epoch in fp32 and bf16, MiniLM SG-OPT fp32 vs bf16 (7 tasks);
            results/gpu/
  profile   (profile.py; by name only) torch.profiler's top operators by self time of pretrain.py's step (BERT-Mini
            and 12 x 768), train.py's SG-OPT step on MiniLM and bert.encode, each in fp32 and bf16: one table a file
            in --profile-out (--profile-workloads to choose)
Ratios are "reference time / our time": above 1 means ours is faster. Times are medians on this machine, not claims.
"""
import argparse
import json

import cli  # cli, data and outputs load no torch: --help answers before torch loads
import data
import outputs
from cli import at_least, die

# -----------------------------------------------------------------------------
# the command line, parsed before the heavy imports

SECTION_NAMES = ("loss", "encoder", "step", "precision", "ddp", "memory", "sts", "wk", "transfer", "epoch", "pretrain",
                 "mlm-precision", "allocator", "compile", "gpu", "profile")  # SECTIONS' keys (checked at the bottom)
WORKLOADS = ("pretrain-mini", "pretrain-12x768", "sgopt-minilm", "encode-minilm")  # benchmarks.profile (checked)
BY_NAME = ("epoch", "allocator", "compile", "gpu", "profile")  # long, or a GPU's, or tables not ratios: by name only
DEFAULT = [s for s in SECTION_NAMES if s not in BY_NAME]


def names_of(known, what):
    """An argparse type: a comma-separated list of names out of `known`, at least one, each once."""
    def parse(spec):
        names = list(dict.fromkeys(x.strip() for x in spec.split(",") if x.strip()))
        unknown = [x for x in names if x not in known]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"{spec!r}: {'unknown ' + what + ' ' + ', '.join(unknown) if unknown else 'no ' + what}"
                                             f"; choose from {','.join(known)}")
        return names
    return parse


def get_args(argv=None):
    ap = argparse.ArgumentParser(description="Side-by-side benchmarks of sgbert against its references.",
                                 epilog="example: python -m lab.bench --only step,sts --device cpu --json bench.json")
    ap.error = die  # a bad flag is one line
    a, n = ap.add_argument, at_least
    a("--json", help="also write the results to this JSON file")
    a("--only", type=names_of(SECTION_NAMES, "section"), default=DEFAULT,
      help=f"comma-separated sections out of {','.join(SECTION_NAMES)} (default: all but epoch, allocator, "
      "compile, gpu and profile)")
    a("--repeats", type=n(1), default=7, help="timed runs per contender (medians are reported; default: %(default)s)")
    a("--device", default="auto", choices=["auto", "cpu", "cuda"],
      help="device of the encoder, step, wk and sts sections (auto: cuda when available); loss is CPU only")
    a("--data-dir", default=None, help="data folder (default $SG_DATA, else ./data); without one, step uses synthetic "
      "sentences and sts and wk are skipped")
    a("--ddp-steps", type=n(1), default=20, help="ddp: training steps per run (default: %(default)s)")
    a("--epoch-steps", type=n(0), default=0, help="epoch: stop after N steps and extrapolate (0: the whole epoch)")
    a("--epoch-precision", choices=["fp32", "bf16"], help="epoch: train.py --precision (default: train.py's, "
      "fp32 on every device)")
    a("--sts-batch", type=n(1), default=64, help="batch size of the length-sorted side of sts (default: %(default)s)")
    a("--transfer-tasks", type=names_of(data.TRANSFER, "task"), default=data.TRANSFER,
      help="transfer: comma-separated tasks (default: all 7)")
    a("--transfer-config", default="paper", choices=["paper", "simcse"],
      help="transfer: the classifier (python -m lab.evaluate --transfer-config; default: %(default)s)")
    a("--transfer-pooling", default="cls",
      help="transfer: the sentence vector, a pooling of bert.POOLINGS (default: cls; checked once torch loads)")
    a("--senteval-threads", type=n(1), default=1, help="transfer: torch threads of SentEval's side (default: "
      "%(default)s, its fastest on a 2-core CPU: its steps are too small to share)")
    a("--transfer-skip-1thread", action="store_true", help="transfer: leave out ours on one thread (the ratio at "
      "equal resources; about a fifth of the run)")
    a("--threads", type=n(1), help="torch CPU threads (default: torch's choice); 1 is steadier on a machine shared "
      "with other jobs")
    a("--alloc-steps", type=n(1), default=20, help="allocator: timed pretraining steps per process (default: "
      "%(default)s; 2 more run first, untimed)")
    a("--profile-out", default="profile", help="profile: the folder of its tables, one file a workload and precision "
      "(default: %(default)s)")
    a("--profile-workloads", type=names_of(WORKLOADS, "workload"), default=list(WORKLOADS),
      help=f"profile: comma-separated workloads out of {','.join(WORKLOADS)} (default: all)")
    a("--peak-child", help=argparse.SUPPRESS)  # internal: one peak_rss_mb measurement
    a("--alloc-child", help=argparse.SUPPRESS)  # internal: one process of the allocator section
    args = ap.parse_args(argv)
    try:
        args.json and outputs.check_output(args.json, ".json")  # before the runs, not after an hour of them
    except outputs.OutputError as e:
        die(f"--json {e}")
    return args


if __name__ == "__main__":
    cli.exit_on_ctrl_c("bench.py")  # Ctrl-C while torch loads: one line and exit code 130
    get_args()  # exits here on --help or a bad flag; main() parses again, after the imports below

import torch

import bert
from lab.benchmarks.common import environment, header, peak_child, save
from lab.benchmarks.compile import bench_compile
from lab.benchmarks.encoder import bench_encoder
from lab.benchmarks.epoch import bench_epoch
from lab.benchmarks.gpu import bench_gpu
from lab.benchmarks.loss import bench_loss, make_loss_run
from lab.benchmarks.precision import bench_mlm_precision, bench_precision
from lab.benchmarks.profile import WORKLOADS as PROFILE_WORKLOADS, bench_profile
from lab.benchmarks.pretrain import alloc_child, bench_allocator, bench_pretrain
from lab.benchmarks.step import bench_ddp, bench_memory, bench_step, make_step_run
from lab.benchmarks.sts import bench_sts, bench_wk
from lab.benchmarks.transfer import bench_transfer

assert WORKLOADS == PROFILE_WORKLOADS, f"bench.WORKLOADS is out of date: {PROFILE_WORKLOADS}"

# -----------------------------------------------------------------------------
# the sections, by name

CASES = {"loss": make_loss_run, "step": make_step_run}  # factories of a zero-argument run, for peak_rss_mb's child
SECTIONS = {"loss": bench_loss, "encoder": bench_encoder, "step": bench_step, "precision": bench_precision,
            "ddp": bench_ddp, "memory": bench_memory, "sts": bench_sts, "wk": bench_wk, "transfer": bench_transfer,
            "epoch": bench_epoch, "pretrain": bench_pretrain,
            "mlm-precision": bench_mlm_precision, "allocator": bench_allocator, "compile": bench_compile,
            "gpu": bench_gpu, "profile": bench_profile}
assert tuple(SECTIONS) == SECTION_NAMES, f"SECTION_NAMES is out of date: {list(SECTIONS)}"


def main(argv=None):
    args = get_args(argv)
    if args.transfer_pooling not in bert.POOLINGS:
        die(f"--transfer-pooling {args.transfer_pooling}: choose from {', '.join(bert.POOLINGS)}")
    if args.peak_child:
        return peak_child(json.loads(args.peak_child), CASES)
    if args.alloc_child:
        return alloc_child(json.loads(args.alloc_child))
    if args.threads:
        torch.set_num_threads(args.threads)
    names = args.only
    results = {"env": environment()}
    print(header(results["env"]))  # the machine, and a warning when it is busy: before any timing
    for name in names:
        print(f"== {name}")
        SECTIONS[name](results, args)
        save(results, args)
    if args.json:
        print(f"wrote {args.json}")


if __name__ == "__main__":
    cli.run(main, "bench.py")
