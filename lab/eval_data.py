"""
The data the lab's evaluations read beyond the core's STS tasks (data.py): SentEval's transfer tasks
and your own STS pairs files (--pairs).

The transfer loaders follow SentEval (facebookresearch/SentEval: senteval/binary.py, sst.py,
trec.py, mrpc.py): the same files, encodings and labels, in file order.
"""
import csv
import math
from pathlib import Path

import numpy as np

from data import TRANSFER, DataError, read_lines, scored_pairs

BINARY_FILES = {"MR": ("rt-polarity.pos", "rt-polarity.neg"), "CR": ("custrev.pos", "custrev.neg"),
                "SUBJ": ("subj.objective", "subj.subjective"),
                "MPQA": ("mpqa.pos", "mpqa.neg")}  # label 1, label 0
TREC_CLASSES = ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")  # the 6 coarse classes; fine dropped
BINARY = {"0": 0, "1": 1}


def tokens(text):
    """A sentence as SentEval hands it to a batcher: its whitespace-split tokens, 1 space apart."""
    return " ".join(text.split())


def sst_line(line):
    text, label = line.split("\t")
    return tokens(text), BINARY[label]


def trec_line(line):
    label, question = line.split(":", 1)
    return tokens(question.split(" ", 1)[1]), TREC_CLASSES.index(label)  # "LABEL:fine words ..."


def mrpc_line(line):
    label, _, _, s1, s2 = line.split("\t")
    return (tokens(s1), tokens(s2)), BINARY[label]


FORMS = {sst_line: "'sentence<TAB>label' with label 0 or 1",
         trec_line: f"'COARSE:fine question' with COARSE one of {' '.join(TREC_CLASSES)}",
         mrpc_line: "5 tab-separated columns 'Quality #1 ID #2 ID #1 String #2 String' with "
                    "Quality 0 or 1"}


def labelled(path, data_dir, parse, encoding="utf-8-sig", header=0, train=False):
    """(examples, labels int64) from parse(line) -> (example, label) of each line after `header`
    lines; a line that does not parse raises DataError naming path:line and the expected form."""
    out = []
    for i, line in enumerate(read_lines(path, data_dir, encoding)[header:], start=header + 1):
        try:
            out.append(parse(line.strip()))
        except (ValueError, IndexError, KeyError):
            raise DataError(f"{path}:{i}: expected {FORMS[parse]}, found {line[:80]!r}") from None
    if not out:
        raise DataError(f"{path}: no examples (the file is empty)")
    x, y = zip(*out)
    if train and len(set(y)) < 2:  # a classifier trained on one class: a meaningless accuracy
        raise DataError(f"{path}: every example has the label {y[0]}; a transfer task needs at "
                        "least two classes (is this the task's own file?)")
    return list(x), np.array(y, dtype=np.int64)


def load_transfer(name, data_dir):
    """One transfer task -> {split: (x, y int64)} in file order, x the sentences (MRPC: (s1, s2)
    pairs). MR, CR, SUBJ, MPQA: one split "all", the first file's lines labelled 1 (empty lines
    kept, as SentEval counts them); SST2: train / dev / test; TREC, MRPC: train / test. MR, CR,
    SUBJ, MPQA and TREC are read as Latin-1 and MRPC's header is skipped, as SentEval does."""
    root = Path(data_dir) / "senteval"
    if name in BINARY_FILES:
        x, y = [], []
        for label, file in zip((1, 0), BINARY_FILES[name]):
            lines = read_lines(root / name / file, data_dir, encoding="latin-1")
            if len(lines) < 10:  # SentEval's 10 folds are stratified: each needs both classes
                raise DataError(f"{root / name / file}: {len(lines)} examples; the 10-fold "
                                "protocol needs at least 10 of each class (is this the task's own "
                                "file?)")
            x += [tokens(line) for line in lines]
            y += [label] * len(lines)
        return {"all": (x, np.array(y, dtype=np.int64))}
    if name == "SST2":
        return {s: labelled(root / "SST" / "binary" / f"sentiment-{s}", data_dir, sst_line,
                            train=s == "train")
                for s in ("train", "dev", "test")}
    if name == "TREC":
        return {s: labelled(root / "TREC" / file, data_dir, trec_line, "latin-1",
                            train=s == "train")
                for s, file in (("train", "train_5500.label"), ("test", "TREC_10.label"))}
    if name == "MRPC":
        return {s: labelled(root / "MRPC" / f"msr_paraphrase_{s}.txt", data_dir, mrpc_line,
                            header=1, train=s == "train")
                for s in ("train", "test")}
    raise DataError(f"unknown transfer task {name!r}: use one of {', '.join(TRANSFER)}")


def load_pairs_file(path):
    """Your own STS data: rows of (sentence1, sentence2, score), tab-separated, or comma-separated
    in a .csv (quoted fields as the csv module reads them), a header row optional (a first row whose
    score is not a number). Any finite scores: the Spearman needs only their order (all equal: no
    order, refused like a file of one pair). -> (s1, s2, gold float64); a bad row is a DataError
    naming its line."""
    path = Path(path)
    if path.is_dir() or not path.is_file():
        what = "is a folder" if path.is_dir() else "not found"
        raise DataError(f"--pairs {path}: {what}; give a file of "
                        "'sentence1<TAB>sentence2<TAB>score' rows (or a .csv of the same three "
                        "columns)")
    lines = read_lines(path)
    rows_in = csv.reader(lines) if path.suffix.lower() == ".csv" else (x.split("\t") for x in lines)
    rows = []
    for i, cols in enumerate(rows_in, start=1):
        if not "".join(cols).strip():
            continue  # a blank line
        if len(cols) != 3:
            raise DataError(f"{path}:{i}: expected 3 columns (sentence1, sentence2, score), found "
                            f"{len(cols)}")
        try:
            y = float(cols[2])
        except ValueError:
            if i == 1:
                continue  # the header
            raise DataError(f"{path}:{i}: score {cols[2].strip()!r} is not a number") from None
        if not math.isfinite(y):
            raise DataError(f"{path}:{i}: score {cols[2].strip()!r} is not a finite number")
        rows.append((i, cols[0].strip(), cols[1].strip(), y))
    return scored_pairs(rows, path)
