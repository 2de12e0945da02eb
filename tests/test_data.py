"""data.py's refusals: STS files that would make a Spearman silently wrong, broken STS-B archives, bad data folders.
Each is a DataError naming the file (and line)."""
import gzip

import pytest

import data
from data import DataError


def stsb(tmp_path, rows):
    d = tmp_path / "senteval/STS/STSBenchmark"
    d.mkdir(parents=True, exist_ok=True)
    (d / "sts-dev.csv").write_text("".join(f"g\td\t2012\t{i:04d}\t{score}\t{a}\t{b}\n"
                                           for i, (score, a, b) in enumerate(rows)))
    return tmp_path


GOOD = [("1.0", "a man .", "a dog ."), ("4.5", "a cat .", "the cat .")]


@pytest.mark.parametrize("rows, message", [
    ([("nan", "a", "b"), *GOOD], "sts-dev.csv:1: gold score 'nan' is not in [0, 5]"),
    ([*GOOD, ("inf", "a", "b")], "sts-dev.csv:3: gold score 'inf' is not in [0, 5]"),
    ([*GOOD, ("5.5", "a", "b")], "sts-dev.csv:3: gold score '5.5' is not in [0, 5]"),
    ([*GOOD, ("-1", "a", "b")], "sts-dev.csv:3"),
    ([("2.0", "a", "b"), ("2.0", "c", "d")], "every gold score is 2.0"),
    ([GOOD[0]], "1 scored pair(s)"),
    ([*GOOD, ("3.0", "a man .", "  ")], "sts-dev.csv:3: empty sentence"),
])
def test_sts_files_that_would_give_a_wrong_spearman_are_refused(tmp_path, rows, message):
    with pytest.raises(DataError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
                       .replace(")", r"\)")):
        data.load_stsb("dev", stsb(tmp_path, rows))
    assert data.load_stsb("dev", stsb(tmp_path, GOOD))[2].tolist() == [1.0, 4.5]


@pytest.mark.parametrize("content", [b"not gzip at all", gzip.compress(b"split\tgenre\n" * 50)[:30],
                                     gzip.compress(b"split\tx\n\xff\xfe\n")])
def test_a_broken_stsbenchmark_archive_is_one_error(tmp_path, content):
    (tmp_path / data.STSB_FILE).write_bytes(content)
    with pytest.raises(DataError, match="not a readable gzip of UTF-8 text"):
        data.training_sentences("stsb", tmp_path)


def test_data_folders(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(DataError, match="is a file"):
        data.resolve_data_dir(str(tmp_path / "file"))
    (tmp_path / "d/senteval").mkdir(parents=True)
    with pytest.raises(DataError, match="no data at"):
        data.resolve_data_dir(str(tmp_path / "d"), fetch=False)
    assert data.resolve_data_dir(str(tmp_path / "d"), fetch=False, need_stsb=False) == tmp_path / "d"
    with pytest.raises(DataError, match="cannot download into"):  # its parent is a file: nothing can be created
        data.download(tmp_path / "file" / "data")


def test_training_data_suffix_tabs_and_folders(tmp_path, capsys):
    """pairs.TSV is a pairs file; a text file of mostly TAB lines is read as sentences, with a warning; a folder is
    named as one."""
    (tmp_path / "pairs.TSV").write_text("a b\tc d\ne f\tg h\n")
    assert data.training_sentences(str(tmp_path / "pairs.TSV")) == [("a b", "c d"), ("e f", "g h")]
    (tmp_path / "mixed.txt").write_text("a b\tc d\ne f\tg h\nplain line\n")
    assert data.training_sentences(str(tmp_path / "mixed.txt"))[0] == "a b\tc d"
    assert "most lines of" in capsys.readouterr().err
    (tmp_path / "plain.txt").write_text("one\ntwo\tthree\nfour\n")
    data.training_sentences(str(tmp_path / "plain.txt"))
    assert "warning" not in capsys.readouterr().err
    with pytest.raises(data.DataError, match="is a folder"):
        data.training_sentences(str(tmp_path))


def test_one_rule_finds_the_data_folder(tmp_path, monkeypatch):
    """--data-dir, else $SG_DATA, else ./data: the tools (resolve_data_dir) and the tests (conftest.shared_data) alike."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SG_DATA", raising=False)
    assert data.data_dir_from() == (data.Path("data"), "the default ./data")
    monkeypatch.setenv("SG_DATA", str(tmp_path / "env"))
    assert data.data_dir_from() == (tmp_path / "env", "$SG_DATA")
    assert data.data_dir_from(str(tmp_path / "arg")) == (tmp_path / "arg", "--data-dir")
    with pytest.raises(DataError, match=r"no data at .*env \(from \$SG_DATA\)"):
        data.resolve_data_dir(fetch=False)


def test_a_relative_data_folder_is_resolved_to_an_absolute_path(tmp_path, monkeypatch):
    """./data (or a relative --data-dir / $SG_DATA) comes back absolute, so a child process started in another folder
    (a sweep's runs, the tests' subprocesses) finds the same data instead of downloading into its own ./data."""
    (tmp_path / "real/senteval").mkdir(parents=True)
    (tmp_path / "real" / data.STSB_FILE).touch()
    (tmp_path / "data").symlink_to(tmp_path / "real")  # as `ln -s ../shared/data data` in a clone
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SG_DATA", raising=False)
    found = [data.resolve_data_dir(fetch=False), data.resolve_data_dir("data", fetch=False)]
    monkeypatch.setenv("SG_DATA", "real")
    found.append(data.resolve_data_dir(fetch=False))
    monkeypatch.chdir(tmp_path / "real")  # another cwd: the folders must still be the same ones
    assert all(d.is_absolute() and (d / "senteval").is_dir() and d.samefile(tmp_path / "real") for d in found), found


def test_skipped_real_data_tests_are_summed_up_in_one_line(tmp_path):
    """Without the data folder the real-data tests are skipped, and the run ends with one line saying how many, where
    it looked and how to point at the data."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    test = Path(__file__).parent / "test_eval.py"
    env = {k: v for k, v in os.environ.items() if k != "SG_DATA"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"{test}::test_real_data_counts"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "1 skipped" in r.stdout, r.stdout + r.stderr
    line = [x for x in r.stdout.splitlines() if "real-data test" in x]
    assert len(line) == 1 and f"no data folder at {tmp_path / 'data'} (from the default ./data)" in line[0], r.stdout
    assert "SG_DATA" in line[0] and "python data.py --download" in line[0]
