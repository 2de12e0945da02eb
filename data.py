"""
The data: where its folder is, the 7 STS evaluation tasks, the training sentences, the download.

The loaders follow SentEval's senteval/sts.py as SimCSE extended it (STS-B, SICK-R: test split).
The folder holds senteval/ (SentEval's downstream/) and stsbenchmark.tsv.gz (all STS-B pairs, what
the official SG-BERT code trains on); `python data.py --download` fetches both.
"""
import gzip
import os
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

import checkpoint
import cli

SENTEVAL_URL = ("https://huggingface.co/datasets/princeton-nlp/datasets-for-simcse/resolve/main/"
                "senteval.tar")
STSB_URL = "https://sbert.net/datasets/stsbenchmark.tsv.gz"
STSB_FILE = "stsbenchmark.tsv.gz"
TASKS = ["STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness"]
SHORT = {"STSBenchmark": "STS-B", "SICKRelatedness": "SICK-R"}  # MTEB's names, as tables show them
TRANSFER = ["MR", "CR", "SUBJ", "MPQA", "SST2", "TREC", "MRPC"]  # SentEval's: lab/eval_data.py

# Scored pairs per task and subset, checked by download(); the STS12-16 keys are the subsets (STS13
# has no SMT: its licence forbids passing it on, and SentEval leaves it out too).
COUNTS = {
    "STS12": {"MSRpar": 750, "MSRvid": 750, "SMTeuroparl": 459, "surprise.OnWN": 750,
              "surprise.SMTnews": 399},
    "STS13": {"FNWN": 189, "headlines": 750, "OnWN": 561},
    "STS14": {"deft-forum": 450, "deft-news": 300, "headlines": 750, "images": 750, "OnWN": 750,
              "tweet-news": 750},
    "STS15": {"answers-forums": 375, "answers-students": 750, "belief": 375, "headlines": 750,
              "images": 750},
    "STS16": {"answer-answer": 254, "headlines": 249, "plagiarism": 230, "postediting": 244,
              "question-question": 209},
    "STSBenchmark": {"train": 5749, "dev": 1500, "test": 1379},
    "SICKRelatedness": {"test": 4927},
    STSB_FILE: {"train": 5749, "dev": 1500, "test": 1379},
}


class DataError(Exception):
    """Missing or malformed data; the message names the path and says what to do."""


def how_to_get(d):
    return (f"run `python data.py --download --data-dir {d}`, or set SG_DATA / --data-dir to a "
            "folder that holds senteval/ (SentEval's processed data/downstream/ folder, e.g. "
            f"SimCSE's senteval.tar) and {STSB_FILE}")


def data_dir_from(arg=None):
    """The one rule: arg (--data-dir), else $SG_DATA, else ./data -> (folder, which named it)."""
    if arg:
        return Path(arg), "--data-dir"
    if os.environ.get("SG_DATA"):
        return Path(os.environ["SG_DATA"]), "$SG_DATA"
    return Path("data"), "the default ./data"


def resolve_data_dir(arg=None, fetch=True, need_stsb=True):
    """The data folder, absolute (as a child process finds it), else fetched or DataError."""
    d, source = data_dir_from(arg)
    d = d.resolve()
    if d.exists() and not d.is_dir():
        raise DataError(f"data folder {d} is a file: give the folder that holds senteval/ and "
                        f"{STSB_FILE}")
    if (d / "senteval").is_dir() and ((d / STSB_FILE).is_file() or not need_stsb):
        return d
    if fetch:
        print(f"data folder {d} lacks senteval/ or {STSB_FILE}: downloading them", file=sys.stderr)
        download(d)
        return d
    raise DataError(f"no data at {d} (from {source}): {how_to_get(d)}")


def read_lines(path, data_dir=None, encoding="utf-8-sig"):
    """Lines split on '\\n' only (not on U+2028 in a sentence), without BOM or CR line ends."""
    path = Path(path)
    if not path.is_file():
        where = (f" (the data folder {data_dir} is incomplete: {how_to_get(data_dir)})"
                 if data_dir else "")
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
    """Rows of stsbenchmark.tsv.gz after its header (8 tab-separated columns, CR LF)."""
    if not Path(path).is_file():
        raise DataError(f"{path} not found: {how_to_get(Path(path).parent)}")
    try:
        with gzip.open(path, "rb") as f:
            rows = [r.split("\t") for r in split_lines(f.read().decode("utf-8"))[1:]]
    except (OSError, EOFError, UnicodeDecodeError) as e:  # not gzip, truncated, not UTF-8
        raise DataError(f"{path}: not a readable gzip of UTF-8 text ({e}); "
                        f"{how_to_get(Path(path).parent)}") from None
    bad = [i + 2 for i, r in enumerate(rows) if len(r) != 8]
    if bad:
        raise DataError(f"{path}: line {bad[0]} does not have the header's 8 tab-separated columns")
    return rows


def sts_subset(folder, subset):
    """SentEval's STS loader: STS.input.SUBSET.txt with STS.gs, by line (empty gold: dropped)."""
    inp, gs = folder / f"STS.input.{subset}.txt", folder / f"STS.gs.{subset}.txt"
    pairs, gold = read_lines(inp, folder.parents[2]), read_lines(gs, folder.parents[2])
    if len(pairs) != len(gold):
        raise DataError(f"{inp} has {len(pairs)} lines but {gs} has {len(gold)}: they must align "
                        "line by line")
    rows = []
    for i, (p, g) in enumerate(zip(pairs, gold)):
        if not g.strip():
            continue
        cols = p.split("\t")
        if len(cols) != 2:
            raise DataError(f"{inp}:{i + 1}: expected 2 tab-separated sentences, found {len(cols)} "
                            "fields")
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
    """[(line, s1, s2, gold)] -> (s1, s2, gold float64), refusing what makes a Spearman wrong."""
    for line, a, b, _ in rows:
        if not a.strip() or not b.strip():
            raise DataError(f"{path}:{line}: empty sentence in a pair")
    if len(rows) < 2:
        raise DataError(f"{path}: {len(rows)} scored pair(s); a Spearman correlation needs at "
                        "least 2")
    y = np.array([r[3] for r in rows], dtype=np.float64)
    if np.ptp(y) == 0:
        raise DataError(f"{path}: every gold score is {y[0]}; a constant gold column has no "
                        "ranking to compare")
    return [r[1] for r in rows], [r[2] for r in rows], y


def load_stsb(split, data_dir):
    """STS-B pairs of one split (senteval/STS/STSBenchmark/sts-<split>.csv) -> (s1, s2, gold)."""
    assert split in ("train", "dev", "test"), \
        f"STS-B split must be train, dev or test, not {split!r}"
    path = Path(data_dir) / "senteval" / "STS" / "STSBenchmark" / f"sts-{split}.csv"
    return table_pairs(path, enumerate(read_lines(path, data_dir), start=1), (5, 6, 4), 7)


def load_sick(data_dir):
    """SICK-R test pairs (senteval/SICK/SICK_test_annotated.txt, after its header row)."""
    path = Path(data_dir) / "senteval" / "SICK" / "SICK_test_annotated.txt"
    lines = [line.strip() for line in read_lines(path, data_dir)]
    return table_pairs(path, enumerate(lines[1:], start=2), (1, 2, 3), 5)


def table_pairs(path, lines, cols, n):
    """Numbered tab-separated lines -> scored_pairs of their columns cols (s1, s2, gold) of n."""
    rows = []
    for i, line in lines:
        c = line.split("\t")
        if len(c) <= max(cols):
            raise DataError(f"{path}:{i}: expected {n} tab-separated columns, found {len(c)}")
        rows.append((i, c[cols[0]], c[cols[1]], parse_score(c[cols[2]], path, i)))
    return scored_pairs(rows, path)


def load_task(name, data_dir):
    """One evaluation task -> {subset: (sents1, sents2, gold float64)}; STS-B, SICK-R: "test"."""
    if name == "STSBenchmark":
        return {"test": load_stsb("test", data_dir)}
    if name == "SICKRelatedness":
        return {"test": load_sick(data_dir)}
    if name not in TASKS:
        raise DataError(f"unknown task {name!r}: use one of {', '.join(TASKS)}")
    folder = Path(data_dir) / "senteval" / "STS" / f"{name}-en-test"
    return {subset: sts_subset(folder, subset) for subset in COUNTS[name]}


def training_sentences(spec, data_dir=None):
    """"stsb" (stsbenchmark.tsv.gz's 17,256 sentences), a file of one sentence a line, or a .tsv of
    (sentence, paraphrase) pairs (tuples)."""
    if spec == "stsb":
        return [s for r in read_stsb_tsv(Path(data_dir) / STSB_FILE) for s in (r[6], r[7])]
    path = Path(spec)
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "not found"
        raise DataError(f"training data {path} {what}: give 'stsb', a UTF-8 text file with one "
                        "sentence per line, or a .tsv of 'sentence<TAB>paraphrase' pairs")
    pairs, out = path.suffix.lower() == ".tsv", []
    for i, line in enumerate(read_lines(path)):
        if not printable(line):
            continue  # blank, or control characters only: not a sentence
        if not pairs:
            out.append(line.strip())
            continue
        pair = tuple(x.strip() for x in line.split("\t"))
        if len(pair) != 2 or not all(printable(x) for x in pair):
            raise DataError(f"{path}:{i + 1}: expected 'sentence<TAB>paraphrase' (2 non-empty "
                            f"columns), found {len(pair)} column(s): {line[:80]!r}")
        out.append(pair)
    if not pairs and sum("\t" in x for x in out) > len(out) / 2:
        print(f"warning: most lines of {path} contain a TAB, but it is read as one sentence per "
              "line (TABs and all); for (sentence, paraphrase) pairs name it .tsv", file=sys.stderr)
    if not out:
        raise DataError(f"{path}: no sentences (the file is empty or blank)")
    return out


def printable(text):
    """At least one character that is neither whitespace nor a control character."""
    return any(c.isprintable() and not c.isspace() for c in text)

# -----------------------------------------------------------------------------
# download


def data_counts(data_dir, parts=("senteval", STSB_FILE)):
    """Scored pairs per task and subset in a data folder, shaped like COUNTS (keys of `parts`)."""
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
    """Extract the tar's folder that holds STS/ and SICK/ (SimCSE's downstream/) to dest."""
    marker = "STS/STSBenchmark/sts-test.csv"
    with tarfile.open(tar_path) as tar:
        names = tar.getnames()
        root = next((n[:-len(marker)] for n in names if n == marker or n.endswith("/" + marker)),
                    None)
        if root is None or not any(n.startswith(root + "SICK/") for n in names):
            raise DataError(f"{tar_path}: no folder with STS/ and SICK/ inside the tar (not "
                            "SentEval's data)")
        members = [m for m in tar.getmembers() if m.name.startswith(root)
                   and m.name != root.rstrip("/")]
        tar.extractall(dest.parent / "unpack", members=members, filter="data")
    (dest.parent / "unpack" / root).rename(dest)


def download(data_dir, senteval_url=SENTEVAL_URL, stsb_url=STSB_URL, counts=COUNTS):
    """Fetch what data_dir lacks beside it, check it, rename it in: never a half-written folder."""
    d = Path(data_dir)
    parts = [p for p in ("senteval", STSB_FILE) if not (d / p).exists()]
    if not parts:
        print(f"{d} already holds senteval/ and {STSB_FILE}: nothing to download", file=sys.stderr)
        return d
    try:
        d.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{d.name}-download-", dir=d.parent))
    except OSError as e:
        raise DataError(f"cannot download into {d.resolve()} ({e.strerror or e}): choose a "
                        "writable --data-dir") from None
    try:
        try:
            if "senteval" in parts:
                checkpoint.fetch(senteval_url, tmp / "senteval.tar")
                unpack_senteval(tmp / "senteval.tar", tmp / "senteval")
            if STSB_FILE in parts:
                checkpoint.fetch(stsb_url, tmp / STSB_FILE)
        except OSError as e:  # urllib.error.URLError is an OSError, so are disk errors
            raise DataError(f"download failed ({e}). Without a network, put SentEval's processed "
                            "data folder (data/downstream/ of SentEval, or downstream/ from "
                            f"SimCSE's senteval.tar at {senteval_url}) at {d / 'senteval'} and "
                            f"{stsb_url} at {d / STSB_FILE}, or point --data-dir / SG_DATA to a "
                            "folder that holds them") from None
        except tarfile.TarError as e:
            raise DataError(f"{senteval_url}: not a readable tar ({e})") from None
        try:
            found = data_counts(tmp, parts)
        except DataError as e:
            raise DataError(f"the downloaded data is not usable: {e}") from None
        want = {k: v for k, v in counts.items()
                if (STSB_FILE if k == STSB_FILE else "senteval") in parts}
        if found != want:
            diff = [f"{k}: {found.get(k)} (expected {want.get(k)})" for k in {**want, **found}
                    if found.get(k) != want.get(k)]
            raise DataError("downloaded data has unexpected pair counts, not used: "
                            + "; ".join(diff))
        if d.exists():  # fill in what is missing; each rename is atomic, all parts checked first
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
    example = "example: python data.py --download --data-dir ~/sgbert-data"
    p = cli.parser("data.py", __doc__.strip().split("\n")[0], example)
    p.add_argument("--download", action="store_true", help=f"fetch senteval/ and {STSB_FILE}")
    p.add_argument("--data-dir", default=None, help="data folder (default: $SG_DATA, else ./data)")
    args = p.parse_args(argv)
    if not args.download:
        cli.die("nothing to do: pass --download (and --data-dir DIR, else $SG_DATA, else ./data)")
    try:
        download(data_dir_from(args.data_dir)[0])
    except DataError as e:
        cli.die(e)


if __name__ == "__main__":  # Ctrl-C: the temp folder is removed, the data folder untouched
    cli.run(main, "data.py")
