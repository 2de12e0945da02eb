"""
How a command writes: output paths checked before any work, atomic writes (a reader sees the old
file or the new one), one process per output (a lock), and what killed runs leave behind. It
imports no project module.
"""
import glob
import json
import math
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path


class OutputError(Exception):
    """An output path no file can be written to; the message names it and the fix."""


class OutputLocked(OutputError):
    """Another live process is writing the same output (output_lock)."""

# -----------------------------------------------------------------------------
# output paths and atomic writes


def check_output(path, suffix):
    """An output file checked first: a name ending in suffix (if any), in a writable folder."""
    p = Path(path)
    if not str(path).strip() or not p.name:
        problem = "is empty"
    elif p.is_dir():
        problem = "is a folder; give a file name" + (f" ending in {suffix}" if suffix else "")
    elif suffix and p.suffix.lower() != suffix:
        problem = f"is not a file name ending in {suffix}"
    elif why := unwritable(p.resolve().parent):
        problem = "is " + why
    else:
        return p
    raise OutputError(f"{path} {problem}")


def unwritable(folder):
    """Why no file can be made in folder, or None; access() says yes to root and on /proc: try."""
    if not folder.is_dir():
        return f"in a folder that does not exist ({folder})"
    why = ""
    try:
        if os.access(folder, os.W_OK):
            fd, probe = tempfile.mkstemp(prefix=".sgbert-", suffix=".probe", dir=folder)
            os.close(fd)
            os.unlink(probe)
            return None
    except OSError as e:
        why = f": {e.strerror or e}"
    return f"in a folder we cannot write to ({folder}{why})"


def same_path(a, b):
    """a and b name one file or folder (once resolved, or one inode): inputs kept from outputs."""
    try:
        return os.path.realpath(a) == os.path.realpath(b) or os.path.samefile(a, b)
    except OSError:  # one of them does not exist
        return False


def atomic_write(path, write):
    """path written through write(f), atomically: a reader sees the old file or the new one."""
    path = Path(os.path.realpath(path))
    tmp = staged(path, write)
    try:
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def staged(path, write):
    """path's new bytes, written through write(f) into its temp file: for the caller to rename."""
    clean_leftovers(path)
    tmp = temp_path(path)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())  # the data is on disk before the rename makes it the file
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return tmp


def write_text(path, text):
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def json_safe(x):
    """NaN / inf (a constant similarity, e.g. [CLS] of the embedding layer) as null: strict JSON."""
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return None if isinstance(x, float) and not math.isfinite(x) else x


def json_text(obj):
    return json.dumps(json_safe(obj), indent=2, allow_nan=False) + "\n"


def write_json(path, obj):
    write_text(path, json_text(obj))

# -----------------------------------------------------------------------------
# one process per output, and what killed runs leave behind


@contextmanager
def output_lock(path):
    """One process per output: an flock on .NAME.lock, which holds the owner's pid. Anyone else
    (this process too) gets OutputLocked at once; a killed owner's flock is gone with it."""
    import fcntl
    path = Path(path)
    lock = path.with_name(f".{path.name}.lock")
    fd = None
    try:  # from the file's creation on, a Ctrl-C in here leaves no lock file (drop_lock)
        while True:
            try:
                fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise OutputError(
                    f"{path}: cannot create the lock file {lock} ({e.strerror})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fd, busy = None, fd  # another process's lock: never ours to remove
                owner = os.read(busy, 32).decode(errors="replace").strip() or "?"
                os.close(busy)
                raise OutputLocked(
                    f"{path} is being written by another process (pid {owner}); wait for it to "
                    f"finish or choose another output (lock file: {lock})") from None
            if same_file(fd, lock):
                break
            fd, stale = None, fd
            os.close(stale)  # its owner removed it between our open and flock: lock the new one
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield path
    finally:
        if fd is not None:
            drop_lock(fd, lock)


def same_file(fd, path):
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def drop_lock(fd, lock):
    """Remove the lock file if this fd holds its flock and it is still named lock; close the fd."""
    import fcntl
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a no-op when we hold it
        if same_file(fd, lock):
            os.unlink(lock)  # before close: whoever opened the old file sees it is gone and retries
    except OSError:
        pass  # held by another process, or removed already
    finally:
        os.close(fd)


def temp_path(path, kind="tmp"):
    """Where path is written before its rename: beside it, hidden, with our pid."""
    return path.with_name(f".{path.name}.{os.getpid()}.{kind}")


def clean_leftovers(path):
    """Remove killed runs' leftovers beside path: .NAME.PID.tmp files or folders."""
    for p in leftovers(path, "tmp"):
        try:
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        except OSError:
            pass  # a leftover we cannot remove is no reason to fail this save


def leftovers(path, kind):
    """The files or folders .NAME.PID.<kind> beside path whose process is dead (temp_path)."""
    out = []
    for p in sorted(path.parent.glob(f".{glob.escape(path.name)}.*.{kind}")):
        pid = p.name[len(path.name) + 2:-len(kind) - 1]
        if pid.isdigit() and not pid_alive(int(pid)):
            out.append(p)
    return out


def pid_alive(pid):
    try:
        os.kill(pid, 0)  # signal 0 sends nothing: it only asks whether the process exists
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # another user's (or no pid of ours: keep its file)
        pass
    return True

