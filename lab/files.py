"""
The lab's writes of more than one file, on checkpoint.py's atomic ones: a text and its JSON record that change
together (write_pair), and a folder replaced by two renames, whose old copy a killed writer may have left aside as
.NAME.PID.old (put back by clean_leftovers).
"""
import os
import shutil
import sys
from pathlib import Path

import outputs


def write_pair(path, text, record_path, record):
    """A text file and its JSON record, which names the text's sha256: two files that change
    together. Both are staged first, then the old record is removed, the text renamed in, the record
    last. An error before the renames changes neither; a kill between them leaves the old or new
    text without a record, never another text's record (readers check its sha256)."""
    paths, tmps = [Path(os.path.realpath(p)) for p in (path, record_path)], []
    try:
        for p, data in zip(paths, (text.encode("utf-8"), outputs.json_text(record).encode("utf-8"))):
            tmps.append(outputs.staged(p, lambda f: f.write(data)))
        if os.path.lexists(paths[1]):
            os.remove(paths[1])
        for tmp, p in zip(tmps, paths):
            os.replace(tmp, p)
    finally:
        for tmp in tmps:
            if os.path.exists(tmp):
                os.remove(tmp)


def clean_leftovers(path):
    """outputs.clean_leftovers, and a folder .NAME.PID.old (an export's or a pretraining's old path) put back if
    path is gone, else removed."""
    for p in outputs.leftovers(path, "old"):
        if not os.path.lexists(path):
            os.rename(p, path)
            print(f"note: put {path} back from {p.name}, where an interrupted export had left it", file=sys.stderr)
        elif p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
    outputs.clean_leftovers(path)
