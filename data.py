"""
The data: where the data folder is, the 7 STS evaluation tasks, the unlabelled training sentences, and the download.

The loaders follow SentEval (facebookresearch/SentEval, senteval/sts.py) as SimCSE extended it (princeton-nlp/SimCSE
SentEval/senteval/sts.py: STS-B and SICK-R read as unsupervised STS tasks on their test split). The folder layout:

    <data dir>/senteval/             SentEval's data/downstream/ folder (STS/, SICK/, ...), SimCSE's senteval.tar
    <data dir>/stsbenchmark.tsv.gz   all STS-B pairs, what the official SG-BERT code trains on

The data dir is --data-dir, else $SG_DATA, else ./data. `python data.py --download` fetches both.
"""
import argparse
import csv
import gzip
import math
import os
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

import checkpoint
import cli

SENTEVAL_URL = "https://huggingface.co/datasets/princeton-nlp/datasets-for-simcse/resolve/main/senteval.tar"
STSB_URL = "https://sbert.net/datasets/stsbenchmark.tsv.gz"
STSB_FILE = "stsbenchmark.tsv.gz"
TASKS = ["STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness"]
SHORT = {"STSBenchmark": "STS-B", "SICKRelatedness": "SICK-R"}  # MTEB's names, as the printed tables show them

# Scored pairs per task and subset, as the data README counts them. The STS12-16 keys are also the subset lists
# (STS13 has no SMT: its licence forbids passing it on, and SentEval leaves it out too). download() checks these.
COUNTS = {
    "STS12": {"MSRpar": 750, "MSRvid": 750, "SMTeuroparl": 459, "surprise.OnWN": 750, "surprise.SMTnews": 399},
    "STS13": {"FNWN": 189, "headlines": 750, "OnWN": 561},
    "STS14": {"deft-forum": 450, "deft-news": 300, "headlines": 750, "images": 750, "OnWN": 750, "tweet-news": 750},
    "STS15": {"answers-forums": 375, "answers-students": 750, "belief": 375, "headlines": 750, "images": 750},
    "STS16": {"answer-answer": 254, "headlines": 249, "plagiarism": 230, "postediting": 244,
              "question-question": 209},
    "STSBenchmark": {"train": 5749, "dev": 1500, "test": 1379},
    "SICKRelatedness": {"test": 4927},
    STSB_FILE: {"train": 5749, "dev": 1500, "test": 1379},
}


class DataError(Exception):
    """Missing or malformed data; the message names the path and says what to do."""


def how_to_get(d):
    return (f"run `python data.py --download --data-dir {d}`, or set SG_DATA / --data-dir to a folder that holds "
            f"senteval/ (SentEval's processed data/downstream/ folder, e.g. SimCSE's senteval.tar) and {STSB_FILE}")


def data_dir_from(arg=None):
    """The one rule for where the data folder is, for every tool and the tests: arg (--data-dir), else $SG_DATA, else
    ./data. -> (the folder, which of the three named it), whether or not it holds anything yet."""
    if arg:
        return Path(arg), "--data-dir"
    if os.environ.get("SG_DATA"):
        return Path(os.environ["SG_DATA"]), "$SG_DATA"
    return Path("data"), "the default ./data"


def resolve_data_dir(arg=None, fetch=True, need_stsb=True):
    """The data folder (data_dir_from). When it lacks senteval/ or (need_stsb: training on STS-B's sentences)
    stsbenchmark.tsv.gz, fetch it (fetch=True) or raise DataError saying where we looked and how to get it. The folder
    comes back absolute: a child process started in another folder (a sweep's runs, a test's) must find the same one."""
    d, source = data_dir_from(arg)
    d = d.resolve()
    if d.exists() and not d.is_dir():
        raise DataError(f"data folder {d} is a file: give the folder that holds senteval/ and {STSB_FILE}")
    if (d / "senteval").is_dir() and ((d / STSB_FILE).is_file() or not need_stsb):
        return d
    if fetch:
        print(f"data folder {d} lacks senteval/ or {STSB_FILE}: downloading them", file=sys.stderr)
        download(d)
        return d
    raise DataError(f"no data at {d} (from {source}): {how_to_get(d)}")

# -----------------------------------------------------------------------------
# reading files


def read_lines(path, data_dir=None, encoding="utf-8-sig"):
    """Lines of a UTF-8 file (or another encoding), split on '\\n' only (str.splitlines would also split on characters
    such as U+0085 or U+2028 inside a sentence), with a BOM and CR line ends removed."""
    path = Path(path)
    if not path.is_file():
        where = f" (the data folder {data_dir} is incomplete: {how_to_get(data_dir)})" if data_dir else ""
        raise DataError(f"{path} not found{where}")
    try:
        text = path.read_bytes().decode(encoding)
    except UnicodeDecodeError as e:
        line = path.read_bytes()[:e.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: not valid UTF-8") from None  # latin-1 never fails
    return split_lines(text)


def split_lines(text):
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    return lines[:-1] if lines and lines[-1] == "" else lines


def read_stsb_tsv(path):
    """Rows of stsbenchmark.tsv.gz after its header (split genre dataset year sid score sentence1 sentence2; CR LF)."""
    if not Path(path).is_file():
        raise DataError(f"{path} not found: {how_to_get(Path(path).parent)}")
    try:
        with gzip.open(path, "rb") as f:
            rows = [r.split("\t") for r in split_lines(f.read().decode("utf-8"))[1:]]
    except (OSError, EOFError, UnicodeDecodeError) as e:  # not gzip, truncated, not UTF-8
        raise DataError(f"{path}: not a readable gzip of UTF-8 text ({e}); {how_to_get(Path(path).parent)}") from None
    bad = [i + 2 for i, r in enumerate(rows) if len(r) != 8]
    if bad:
        raise DataError(f"{path}: line {bad[0]} does not have the 8 tab-separated columns of the header")
    return rows


def sts_subset(folder, subset):
    """SentEval's STS loader for one subset: STS.input.<subset>.txt (sentence TAB sentence) aligned line by line with
    STS.gs.<subset>.txt; the pairs whose gold line is empty are unscored and dropped."""
    inp, gs = folder / f"STS.input.{subset}.txt", folder / f"STS.gs.{subset}.txt"
    pairs, gold = read_lines(inp, folder.parents[2]), read_lines(gs, folder.parents[2])
    if len(pairs) != len(gold):
        raise DataError(f"{inp} has {len(pairs)} lines but {gs} has {len(gold)}: they must align line by line")
    rows = []
    for i, (p, g) in enumerate(zip(pairs, gold)):
        if not g.strip():
            continue
        cols = p.split("\t")
        if len(cols) != 2:
            raise DataError(f"{inp}:{i + 1}: expected 2 tab-separated sentences, found {len(cols)} fields")
        rows.append((i + 1, cols[0], cols[1], parse_score(g, gs, i + 1)))
    return scored_pairs(rows, inp)


def parse_score(s, path, line):
    """A gold similarity score: a finite number in [0, 5], else DataError naming path:line."""
    try:
        y = float(s)
    except ValueError:
        raise DataError(f"{path}:{line}: gold score {s.strip()!r} is not a number") from None
    if not 0 <= y <= 5:  # also NaN and inf
        raise DataError(f"{path}:{line}: gold score {s.strip()!r} is not in [0, 5]")
    return y


def scored_pairs(rows, path):
    """[(line, s1, s2, gold)] -> (s1, s2, gold float64), refusing what would make a Spearman silently wrong or
    undefined: an empty sentence, fewer than 2 pairs, a constant gold column."""
    for line, a, b, _ in rows:
        if not a.strip() or not b.strip():
            raise DataError(f"{path}:{line}: empty sentence in a pair")
    if len(rows) < 2:
        raise DataError(f"{path}: {len(rows)} scored pair(s); a Spearman correlation needs at least 2")
    y = np.array([r[3] for r in rows], dtype=np.float64)
    if np.ptp(y) == 0:
        raise DataError(f"{path}: every gold score is {y[0]}; a constant gold column has no ranking to compare")
    return [r[1] for r in rows], [r[2] for r in rows], y


def load_stsb(split, data_dir):
    """STS-B pairs of one split from senteval/STS/STSBenchmark/sts-<split>.csv: tab-separated, 7 columns
    (genre, dataset, year, id, score, sentence 1, sentence 2) -> (s1, s2, gold)."""
    assert split in ("train", "dev", "test"), f"STS-B split must be train, dev or test, not {split!r}"
    path = Path(data_dir) / "senteval" / "STS" / "STSBenchmark" / f"sts-{split}.csv"
    rows = []
    for i, line in enumerate(read_lines(path, data_dir)):
        cols = line.split("\t")
        if len(cols) < 7:
            raise DataError(f"{path}:{i + 1}: expected 7 tab-separated columns, found {len(cols)}")
        rows.append((i + 1, cols[5], cols[6], parse_score(cols[4], path, i + 1)))
    return scored_pairs(rows, path)


def load_sick(data_dir):
    """SICK-R test pairs from senteval/SICK/SICK_test_annotated.txt: a header, then pair_ID, sentence_A, sentence_B,
    relatedness_score, entailment_judgment (CR LF line ends in the official release)."""
    path = Path(data_dir) / "senteval" / "SICK" / "SICK_test_annotated.txt"
    lines = [line.strip() for line in read_lines(path, data_dir)]
    rows = []
    for i, line in enumerate(lines[1:], start=2):
        cols = line.split("\t")
        if len(cols) < 4:
            raise DataError(f"{path}:{i}: expected 5 tab-separated columns, found {len(cols)}")
        rows.append((i, cols[1], cols[2], parse_score(cols[3], path, i)))
    return scored_pairs(rows, path)


def load_task(name, data_dir):
    """One evaluation task -> {subset: (sents1, sents2, gold float64)}; STS-B and SICK-R: one subset, the test split."""
    if name == "STSBenchmark":
        return {"test": load_stsb("test", data_dir)}
    if name == "SICKRelatedness":
        return {"test": load_sick(data_dir)}
    if name not in TASKS:
        raise DataError(f"unknown task {name!r}: use one of {', '.join(TASKS)}")
    folder = Path(data_dir) / "senteval" / "STS" / f"{name}-en-test"
    return {subset: sts_subset(folder, subset) for subset in COUNTS[name]}


def load_pairs_file(path):
    """Your own STS data: rows of (sentence1, sentence2, score), tab-separated, or comma-separated in a .csv (quoted
    fields as the csv module reads them), a header row optional (a first row whose score is not a number). Any finite
    scores: the Spearman needs only their order (all equal: no order, refused like a file of one pair).
    -> (s1, s2, gold float64); a bad row is a DataError naming its line."""
    path = Path(path)
    if path.is_dir() or not path.is_file():
        raise DataError(f"--pairs {path}: {'is a folder' if path.is_dir() else 'not found'}; give a file of "
                        "'sentence1<TAB>sentence2<TAB>score' rows (or a .csv of the same three columns)")
    lines = read_lines(path)
    rows_in = csv.reader(lines) if path.suffix.lower() == ".csv" else (line.split("\t") for line in lines)
    rows = []
    for i, cols in enumerate(rows_in, start=1):
        if not "".join(cols).strip():
            continue  # a blank line
        if len(cols) != 3:
            raise DataError(f"{path}:{i}: expected 3 columns (sentence1, sentence2, score), found {len(cols)}")
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


def training_sentences(spec, data_dir=None):
    """Unlabelled training sentences. "stsb": both sentences of every row of stsbenchmark.tsv.gz (train, dev and test:
    17,256 sentences, what the official code trains on). Otherwise a UTF-8 text file, one sentence per line, or a
    .tsv file of (sentence, paraphrase) pairs, returned as tuples. Lines of whitespace or control characters only
    are skipped."""
    if spec == "stsb":
        return [s for r in read_stsb_tsv(Path(data_dir) / STSB_FILE) for s in (r[6], r[7])]
    path = Path(spec)
    if path.is_dir():
        raise DataError(f"training data {path} is a folder: give 'stsb', a UTF-8 text file with one sentence per line, "
                        "or a .tsv of 'sentence<TAB>paraphrase' pairs")
    if not path.is_file():
        raise DataError(f"training data {path} not found: give 'stsb', a UTF-8 text file with one sentence per line, "
                        "or a .tsv of 'sentence<TAB>paraphrase' pairs")
    pairs, out = path.suffix.lower() == ".tsv", []
    for i, raw in enumerate(path.read_bytes().split(b"\n")):
        try:
            line = raw.decode("utf-8-sig" if i == 0 else "utf-8").strip("\r\n")
        except UnicodeDecodeError:
            raise DataError(f"{path}:{i + 1}: line is not valid UTF-8 (save the file as UTF-8)") from None
        if not printable(line):
            continue  # blank, or control characters only: not a sentence
        if not pairs:
            out.append(line.strip())
            continue
        pair = tuple(x.strip() for x in line.split("\t"))
        if len(pair) != 2 or not all(printable(x) for x in pair):
            raise DataError(f"{path}:{i + 1}: expected 'sentence<TAB>paraphrase' (2 non-empty columns), found "
                            f"{len(pair)} column(s): {line[:80]!r}")
        out.append(pair)
    if not pairs and sum("\t" in x for x in out) > len(out) / 2:
        print(f"warning: most lines of {path} contain a TAB, but it is read as one sentence per line (TABs and all); "
              "for (sentence, paraphrase) pairs name it .tsv", file=sys.stderr)
    if not out:
        raise DataError(f"{path}: no sentences (the file is empty or blank)")
    return out


def printable(text):
    """Has at least one character that is neither whitespace nor a control character."""
    return any(c.isprintable() and not c.isspace() for c in text)

# -----------------------------------------------------------------------------
# SentEval transfer tasks (senteval/binary.py, sst.py, trec.py, mrpc.py)

TRANSFER = ["MR", "CR", "SUBJ", "MPQA", "SST2", "TREC", "MRPC"]
BINARY_FILES = {"MR": ("rt-polarity.pos", "rt-polarity.neg"), "CR": ("custrev.pos", "custrev.neg"),
                "SUBJ": ("subj.objective", "subj.subjective"), "MPQA": ("mpqa.pos", "mpqa.neg")}  # label 1, label 0
TREC_CLASSES = ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")  # the 6 coarse classes; the fine label is dropped
BINARY = {"0": 0, "1": 1}


def tokens(text):
    """A sentence as SentEval hands it to a batcher: its whitespace-split tokens, joined by one space."""
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
         mrpc_line: "5 tab-separated columns 'Quality #1 ID #2 ID #1 String #2 String' with Quality 0 or 1"}


def labelled(path, data_dir, parse, encoding="utf-8-sig", header=0, train=False):
    """(examples, labels int64) from parse(line) -> (example, label) of each line after `header` lines; a line that
    does not parse raises DataError naming path:line and the expected form."""
    out = []
    for i, line in enumerate(read_lines(path, data_dir, encoding)[header:], start=header + 1):
        try:
            out.append(parse(line.strip()))
        except (ValueError, IndexError, KeyError):
            raise DataError(f"{path}:{i}: expected {FORMS[parse]}, found {line[:80]!r}") from None
    if not out:
        raise DataError(f"{path}: no examples (the file is empty)")
    x, y = zip(*out)
    if train and len(set(y)) < 2:  # a classifier trained on one class: a meaningless accuracy, never a silent one
        raise DataError(f"{path}: every example has the label {y[0]}; a transfer task needs at least two classes "
                        "(is this the task's own file?)")
    return list(x), np.array(y, dtype=np.int64)


def load_transfer(name, data_dir):
    """One transfer task -> {split: (x, y int64)} in file order, x the sentences (MRPC: (s1, s2) pairs).
    MR, CR, SUBJ, MPQA: one split "all", the first file's lines labelled 1 (empty lines kept, as SentEval counts
    them); SST2: train / dev / test; TREC, MRPC: train / test. MR, CR, SUBJ, MPQA and TREC are read as Latin-1 and
    MRPC's header is skipped, as SentEval does."""
    root = Path(data_dir) / "senteval"
    if name in BINARY_FILES:
        x, y = [], []
        for label, file in zip((1, 0), BINARY_FILES[name]):
            lines = read_lines(root / name / file, data_dir, encoding="latin-1")
            if len(lines) < 10:  # SentEval's 10 folds are stratified: each needs examples of both classes
                raise DataError(f"{root / name / file}: {len(lines)} examples; the 10-fold protocol needs at least 10 "
                                "of each class (is this the task's own file?)")
            x += [tokens(line) for line in lines]
            y += [label] * len(lines)
        return {"all": (x, np.array(y, dtype=np.int64))}
    if name == "SST2":
        return {s: labelled(root / "SST" / "binary" / f"sentiment-{s}", data_dir, sst_line, train=s == "train")
                for s in ("train", "dev", "test")}
    if name == "TREC":
        return {s: labelled(root / "TREC" / file, data_dir, trec_line, "latin-1", train=s == "train")
                for s, file in (("train", "train_5500.label"), ("test", "TREC_10.label"))}
    if name == "MRPC":
        return {s: labelled(root / "MRPC" / f"msr_paraphrase_{s}.txt", data_dir, mrpc_line, header=1, train=s == "train")
                for s in ("train", "test")}
    raise DataError(f"unknown transfer task {name!r}: use one of {', '.join(TRANSFER)}")

# -----------------------------------------------------------------------------
# download


def data_counts(data_dir, parts=("senteval", STSB_FILE)):
    """Scored pairs per task and subset found in a data folder, shaped like COUNTS (only the keys of `parts`)."""
    out = {}
    if "senteval" in parts:
        for name in TASKS[:5]:
            out[name] = {k: len(v[2]) for k, v in load_task(name, data_dir).items()}
        out["STSBenchmark"] = {s: len(load_stsb(s, data_dir)[2]) for s in ("train", "dev", "test")}
        out["SICKRelatedness"] = {"test": len(load_sick(data_dir)[2])}
    if STSB_FILE in parts:
        splits = [r[0] for r in read_stsb_tsv(Path(data_dir) / STSB_FILE)]
        out[STSB_FILE] = {s: splits.count(s) for s in dict.fromkeys(splits)}
    return out


def unpack_senteval(tar_path, dest):
    """Extract the folder of the tar that holds STS/ and SICK/ (SimCSE's tar has it as downstream/, SentEval's as
    SentEval/data/downstream/) to dest."""
    marker = "STS/STSBenchmark/sts-test.csv"
    with tarfile.open(tar_path) as tar:
        names = tar.getnames()
        root = next((n[:-len(marker)] for n in names if n == marker or n.endswith("/" + marker)), None)
        if root is None or not any(n.startswith(root + "SICK/") for n in names):
            raise DataError(f"{tar_path}: no folder with STS/ and SICK/ inside the tar (not SentEval's data)")
        members = [m for m in tar.getmembers() if m.name.startswith(root) and m.name != root.rstrip("/")]
        tar.extractall(dest.parent / "unpack", members=members, filter="data")
    (dest.parent / "unpack" / root).rename(dest)


def download(data_dir, senteval_url=SENTEVAL_URL, stsb_url=STSB_URL, counts=COUNTS):
    """Fetch what data_dir lacks (senteval/, stsbenchmark.tsv.gz) into a temp folder beside it, check the layout and
    the pair counts, then rename into place: a failure never leaves a half-written data folder."""
    d = Path(data_dir)
    parts = [p for p in ("senteval", STSB_FILE) if not (d / p).exists()]
    if not parts:
        print(f"{d} already holds senteval/ and {STSB_FILE}: nothing to download", file=sys.stderr)
        return d
    try:
        d.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{d.name}-download-", dir=d.parent))
    except OSError as e:
        raise DataError(f"cannot download into {d.resolve()} ({e.strerror or e}): choose a writable --data-dir") from None
    try:
        try:
            if "senteval" in parts:
                checkpoint.fetch(senteval_url, tmp / "senteval.tar")
                unpack_senteval(tmp / "senteval.tar", tmp / "senteval")
            if STSB_FILE in parts:
                checkpoint.fetch(stsb_url, tmp / STSB_FILE)
        except OSError as e:  # urllib.error.URLError is an OSError, so are disk errors
            raise DataError(f"download failed ({e}). Without a network, put SentEval's processed data folder "
                            f"(data/downstream/ of SentEval, or downstream/ from SimCSE's senteval.tar at "
                            f"{senteval_url}) at {d / 'senteval'} and {stsb_url} at {d / STSB_FILE}, or point "
                            "--data-dir / SG_DATA to a folder that holds them") from None
        except tarfile.TarError as e:
            raise DataError(f"{senteval_url}: not a readable tar ({e})") from None
        try:
            found = data_counts(tmp, parts)
        except DataError as e:
            raise DataError(f"the downloaded data is not usable: {e}") from None
        want = {k: v for k, v in counts.items() if (STSB_FILE if k == STSB_FILE else "senteval") in parts}
        if found != want:
            diff = [f"{k}: {found.get(k)} (expected {want.get(k)})" for k in {**want, **found}
                    if found.get(k) != want.get(k)]
            raise DataError(f"downloaded data has unexpected pair counts, not used: {'; '.join(diff)}")
        if d.exists():  # fill in what is missing; each rename is atomic and all parts were checked before the first
            for p in parts:
                (tmp / p).rename(d / p)
        else:
            (tmp / "senteval.tar").unlink(missing_ok=True)
            shutil.rmtree(tmp / "unpack", ignore_errors=True)
            tmp.chmod(0o755)  # mkdtemp made it private
            tmp.rename(d)
        print(f"data ready in {d}", file=sys.stderr)
        return d
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().split("\n")[0],
                                     epilog="example: python data.py --download --data-dir ~/sgbert-data")
    parser.error = cli.die  # a bad flag is one line
    parser.add_argument("--download", action="store_true", help="fetch senteval/ and stsbenchmark.tsv.gz")
    parser.add_argument("--data-dir", default=None, help="data folder (default: $SG_DATA, else ./data)")
    args = parser.parse_args(argv)
    if not args.download:
        cli.die("nothing to do: pass --download (and --data-dir DIR, else $SG_DATA, else ./data)")
    try:
        download(data_dir_from(args.data_dir)[0])
    except DataError as e:
        cli.die(e)


if __name__ == "__main__":  # Ctrl-C: the download's temp folder is removed on the way out, the data folder untouched
    cli.run(main, "data.py")
