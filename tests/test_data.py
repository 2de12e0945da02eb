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
