"""
How a run uses the machine, out of the reader's way: several processes, and bf16 on a CPU.

`torchrun --nproc_per_node N train.py ...` runs one process per GPU (NCCL), or gloo ranks on a CPU.
--batch-size stays the global batch b: each process encodes b / N sentences and the contrast runs
against the whole batch (gather), so N processes run the experiment of one. Rank 0 evaluates, logs
and writes the checkpoint. bf16 on a CPU without bf16 matrix units: Bf16Products, at fp32's speed.
"""
import contextlib
import os
import sys
import warnings

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils._python_dispatch import TorchDispatchMode

import cli
from cli import die


def init(cfg):
    """-> (rank, world size, device). Under torchrun (WORLD_SIZE, RANK, LOCAL_RANK set): one process
    per device, NCCL on CUDA, gloo on a CPU; only rank 0 prints. Else one process on --device."""
    cuda = cli.device(cfg.device) == "cuda"
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    if world == 1:
        return 0, 1, torch.device("cuda" if cuda else "cpu")
    if cfg.batch_size % world:
        die(f"--batch-size {cfg.batch_size} does not divide over {world} processes: it is the "
            f"global batch, split evenly (use a multiple of {world})")
    if cfg.eval_only:
        die("--eval-only runs in one process: run it with python, not torchrun")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda and device.index >= torch.cuda.device_count():
        die(f"process {rank} wants GPU {device.index} but {torch.cuda.device_count()} are visible: "
            "--nproc_per_node at most the number of GPUs (or --device cpu)")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    if rank:
        sys.stdout = open(os.devnull, "w")  # one log: rank 0's (errors still reach stderr)
    return rank, world, device


def gather(x):
    """x (b_local, ...) of every process, in rank order -> (b, ...). With autograd when x carries a
    gradient: the backward gives each process the gradient of its rows from every process's loss."""
    if x.requires_grad:
        with warnings.catch_warnings():  # torch 2.13 marks it deprecated for a private successor
            warnings.simplefilter("ignore", FutureWarning)
            return torch.cat(dist_nn.all_gather(x))
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts)


def mean(x, world):
    """The mean of x over the processes (the global batch's loss)."""
    if world > 1:
        dist.all_reduce(x := x.clone())
        x /= world
    return x


def agree(flag, world, device):
    """Rank 0's decision (early stop, a failed evaluation) on every process: they stop together."""
    if world == 1:
        return flag
    t = torch.tensor([float(flag)], device=device)
    dist.broadcast(t, 0)
    return bool(t.item())


def wrap(bert_T, head, device, world):
    """DDP wrappers on several processes (rank 0's weights broadcast); BERT_F is never wrapped."""
    if world == 1:
        return bert_T, head
    ids = [device.index] if device.type == "cuda" else None
    bert_T = DDP(bert_T, device_ids=ids)
    head = DDP(head, device_ids=ids) if any(p.requires_grad for p in head.parameters()) else head
    return bert_T, head


def raw(m):
    """The module itself, under its DDP wrapper if it has one (nanoGPT's raw_model)."""
    return m.module if isinstance(m, DDP) else m


def sync(device):
    """Wait for the GPU (a timer's reading is the work's, not the launch's)."""
    if device.type == "cuda":
        torch.cuda.synchronize()


def close():
    """Every rank past its last collective, then the process group released."""
    dist.barrier()
    dist.destroy_process_group()


def leave(code):
    """Exit at once, while the run still holds the DDP reducer: dropping the last reference to the
    gloo group joins its worker threads with the GIL held, and a worker may need the GIL."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# -----------------------------------------------------------------------------
# bf16 matrix products on a CPU without a bf16 unit

MATRIX_PRODUCTS = {torch.ops.aten.mm.default, torch.ops.aten.bmm.default,
                   torch.ops.aten.addmm.default, torch.ops.aten.baddbmm.default,
                   torch.ops.aten.addbmm.default}


class Bf16Products(TorchDispatchMode):
    """bf16 matrix products as a bf16 unit computes them, on a CPU without one: operands widened
    to fp32, one fp32 GEMM, rounded to bf16 (torch's own bf16 GEMM: the same numbers, 5-50x slower).
    Below autograd, so the backward's products are caught too; other ops run as torch runs them."""

    @staticmethod
    def catches(func, args):
        """Whether this op is a matrix product with a bf16 operand (the ops the mode widens)."""
        return func in MATRIX_PRODUCTS and any(isinstance(a, torch.Tensor)
                                               and a.dtype == torch.bfloat16 for a in args)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.catches(func, args):
            wide = [a.float() if isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 else a
                    for a in args]
            return func(*wide, **(kwargs or {})).to(torch.bfloat16)
        return func(*args, **(kwargs or {}))


def bf16_products(precision, device_type):
    """What a --precision run holds around its passes: Bf16Products for bf16 on a CPU without bf16
    matrix instructions (cli.bf16_unit), else nothing (fp32; a bf16 unit or a GPU runs torch's)."""
    emulate = precision == "bf16" and device_type == "cpu" and not cli.bf16_unit()
    return Bf16Products() if emulate else contextlib.nullcontext()
