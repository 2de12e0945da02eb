"""lab/cpu.py: the CPU kind read from a /proc/cpuinfo text."""
import sys

import pytest

from lab import cpu

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
    info = cpu.cpuinfo(f)
    assert info["cpu family"] == "6" and info["model"] == "207"
    assert info["model name"] == "INTEL(R) XEON(R) PLATINUM 8581C CPU @ 2.10GHz"
    assert "amx_tile" in info["flags"].split()
    assert cpu.cpuinfo(tmp_path / "absent") == {}  # not Linux: no file, no keys


@pytest.mark.parametrize("flags, amx", [(" amx_bf16 amx_tile amx_int8", True), ("", False), (" amx_tile", False)])
def test_cpu_kind_says_whether_the_cpu_has_amx_and_its_family_and_model(tmp_path, monkeypatch, flags, amx):
    """'amx': both amx_tile and amx_bf16 in the flags (the VM of 2026-11-29 listed avx512_bf16 without them);
    'family_model': "family/model"; the keys that were there before keep their meaning."""
    f = tmp_path / "cpuinfo"
    f.write_text(XEON.format(amx=flags))
    read = cpu.cpuinfo
    monkeypatch.setattr(cpu, "cpuinfo", lambda path="/proc/cpuinfo": read(f))
    kind = cpu.cpu_kind()
    assert kind["amx"] is amx and kind["family_model"] == "6/207"
    assert kind["model"] == "INTEL(R) XEON(R) PLATINUM 8581C CPU @ 2.10GHz"
    assert {"capability", "bf16_unit"} <= set(kind) and isinstance(kind["bf16_unit"], bool)


def test_cpu_kind_without_proc_cpuinfo(monkeypatch):
    monkeypatch.setattr(cpu, "cpuinfo", lambda path="/proc/cpuinfo": {})
    kind = cpu.cpu_kind()
    assert kind["amx"] is False and kind["family_model"] is None and kind["model"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads this machine's /proc/cpuinfo")
def test_cpu_kind_of_this_machine_names_its_amx_flags():
    flags = set(cpu.cpuinfo().get("flags", "").split())
    assert cpu.cpu_kind()["amx"] == ({"amx_tile", "amx_bf16"} <= flags)
