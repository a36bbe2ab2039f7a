"""Every file membench writes goes through here (logs excepted: a worker appends to its log as it runs).

Write-then-rename: the data goes to a temporary file beside the target, is flushed to disk, then renamed over
the target in one step, so a reader, a crash, a kill -9 or a full disk never leaves half a file where a result,
a timeline or a report was. A write that fails for a reason outside membench (no space, read-only folder, no
permission, a name too long) is the user's to fix: it becomes a UserError (one line, exit code 2).
"""

from __future__ import annotations

import errno
import os
import re
import stat
import tempfile
from pathlib import Path

from membench.common.errors import UserError

# mkstemp creates files 0600; membench's files are as readable as any other file the user creates.
_UMASK = os.umask(0)
os.umask(_UMASK)
FILE_MODE = 0o666 & ~_UMASK

# Side files (timelines, snapshots) read back by `membench report` are at most this big: a result file can name
# any path, and /dev/zero or a huge file must not eat the machine's memory.
MAX_SIDE_FILE_BYTES = 64 * 2**20

# Failures of the machine or the user's folder, not of membench: said in one line.
_ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENAMETOOLONG,
                       errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.ENOENT, errno.ELOOP, errno.EFBIG}


def user_error(exc: OSError, action: str, path: Path) -> UserError:
    """One line naming the path and what the system said, e.g. 'cannot write x.json: No space left on device'."""
    reason = exc.strerror or str(exc)
    if exc.errno == errno.EEXIST:
        reason = "a file of that name is in the way"
    return UserError(f"cannot {action} {path}: {reason}")


def is_environment_error(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in _ENVIRONMENT_ERRNOS


def make_dir(path: Path) -> Path:
    """mkdir -p, with a full disk, a read-only parent or a file in the way said in one line."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if not is_environment_error(exc):
            raise
        raise user_error(exc, "create the folder", path) from None
    if not path.is_dir():
        raise UserError(f"cannot use {path} as a folder: it is a file")
    return path


def open_lock_file(folder: Path, name: str) -> int:
    """The descriptor of <folder>/<name>, created if missing, for an flock: never through a link planted in its
    place, not inherited by child processes (O_CLOEXEC by default); an unwritable folder is one UserError."""
    path = Path(folder) / name
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UserError(f"{path} is a symlink: membench does not write through links; remove it") from None
        if not is_environment_error(exc):
            raise
        raise user_error(exc, "write in", Path(folder)) from None


def atomic_write_bytes(path: Path, data: bytes) -> int:
    """Write `data` at `path` all or nothing; returns its size. The folder must exist. A symlink at `path` is
    replaced, never written through."""
    path = Path(path)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:100]}.", suffix=".tmp")
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        if not is_environment_error(exc):
            raise
        raise user_error(exc, "write", path) from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    return len(data)


def atomic_write_text(path: Path, text: str) -> int:
    return atomic_write_bytes(path, text.encode("utf-8"))


def check_regular_target(path: Path, option: str) -> Path:
    """A file the user named (e.g. `compare --markdown PATH`) is written only where it is a regular file or
    nothing yet: a device, a FIFO, a folder or a symlink there is refused, never replaced or written through."""
    path = Path(path)
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise user_error(exc, "write", path) from None
    if not stat.S_ISREG(mode):
        kind = ("a symlink" if stat.S_ISLNK(mode) else "a folder" if stat.S_ISDIR(mode) else
                "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else
                "not a regular file")
        raise UserError(f"{option} {path} is {kind}: membench writes only regular files; name a new or regular file")
    return path


TEXT_SUFFIXES = (".md", ".markdown", ".txt")


def check_text_target(path: Path, option: str) -> Path:
    """A text file the user named (`compare --markdown PATH`): a new file, or one with a text suffix that an earlier
    call wrote; an existing file of any other name (a result's .json, a snapshot) is refused, never written over."""
    path = check_regular_target(path, option)
    if path.exists() and path.suffix.lower() not in TEXT_SUFFIXES:
        raise UserError(f"{option} {path} exists and is not a {'/'.join(TEXT_SUFFIXES)} file: membench never writes "
                        "over it (it may be a measured result); name a new file")
    return path


def own_dir(path: Path) -> Path:
    """A folder membench creates inside --out (runs/, previous/, report/): made if missing, refused if a symlink
    is in its place (files would be written or moved wherever it points)."""
    path = Path(path)
    if path.is_symlink():
        raise UserError(f"{path} is a symlink (to {os.readlink(path)}): membench does not write through links; "
                        "remove it")
    return make_dir(path)


def open_fresh(path: Path):
    """Open `path` for writing as a new file (a log): whatever is there, a symlink included, is replaced, so
    nothing is truncated or written through a link."""
    path = Path(path)
    try:
        if path.is_symlink():
            path.unlink()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, FILE_MODE | 0o600)
    except OSError as exc:
        if not is_environment_error(exc):
            raise
        raise user_error(exc, "write", path) from None
    return os.fdopen(fd, "w")


_UNSAFE = re.compile(r"[^A-Za-z0-9._+=-]+")


def safe_component(text: object, limit: int = 80) -> str:
    """A name that comes from a file (a workload, a run name) as one harmless path component: no separators,
    no '..', no control characters, at most `limit` characters."""
    name = _UNSAFE.sub("_", str(text)).strip("._") or "_"
    return name[:limit]


def side_file(folder: Path, name: object) -> Path | None:
    """The file `name` (as a result file names it) inside `folder`, or None where it is not a regular file
    there: an absolute path, '..', a symlink out of the folder, a device or a folder are not followed."""
    if not isinstance(name, str) or not name or "\0" in name:
        return None
    root = Path(folder).resolve()
    try:
        path = (root / name).resolve()
        if not path.is_relative_to(root) or not path.is_file():
            return None
    except (OSError, RuntimeError):  # a symlink loop; a name longer than the file system takes
        return None
    return path


def read_bounded(path: Path, limit: int | None = None) -> bytes | None:
    """The file's bytes, or None if it holds more than `limit` (default MAX_SIDE_FILE_BYTES; it is then not read
    further)."""
    limit = MAX_SIDE_FILE_BYTES if limit is None else limit
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    return data if len(data) <= limit else None
