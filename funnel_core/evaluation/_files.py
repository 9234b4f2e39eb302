"""Writing and reading the evaluation's own files without following what someone planted there.

Every write is a no-follow, exclusive create of a temporary file in the target's folder, then an
atomic :func:`os.replace` over the target: a symbolic link at the target's name is replaced (the
link itself, never what it points to), and a reader never sees half a file. Appends open the file
with ``O_NOFOLLOW | O_NONBLOCK`` and refuse anything that is not a regular file (a FIFO would
block, a device would swallow or supply bytes). Reads check the file with ``lstat`` before
opening it (a FIFO or a link to ``/dev/zero`` is refused, not read) and are bounded in size.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from funnel_core.errors import FunnelError

__all__ = ["UnsafeFileError", "TooLargeError", "write_atomic", "append_text", "read_bounded",
           "check_plain_or_absent"]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_BINARY = getattr(os, "O_BINARY", 0)


class UnsafeFileError(FunnelError, ValueError):
    """A file the evaluation writes or reads is a link, FIFO, device, folder or too large."""


class TooLargeError(UnsafeFileError):
    """A file is larger than its reader accepts (it was not written by the evaluation)."""


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def check_plain_or_absent(path: str | os.PathLike, what: str = "file") -> bool:
    """``True`` when ``path`` is a regular file (not a link), ``False`` when nothing is there;
    raises :class:`UnsafeFileError` for anything else."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFileError(f"the {what} {str(path)!r} is {_kind(st.st_mode)}, which the evaluation neither "
                              "reads nor writes through; remove it (or choose another output folder).")
    return True


def write_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path``: a temporary file created no-follow and exclusively in the same
    folder, flushed, then :func:`os.replace`d over ``path``. A link at ``path`` is replaced, its
    target untouched; a folder or other non-file at ``path`` is refused."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        raise UnsafeFileError(f"{str(path)!r} is {_kind(st.st_mode)}; the evaluation writes only regular files "
                              "there: remove it or choose another output folder.")
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(8)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _BINARY, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def append_text(path: str | os.PathLike, text: str) -> None:
    """Append ``text`` (UTF-8) to the regular file ``path`` (created when absent), never through
    a link and never blocking on a FIFO."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW | _NONBLOCK | _BINARY, 0o644)
    except OSError as exc:
        raise UnsafeFileError(f"cannot append to {str(path)!r} ({exc.strerror or exc}); it may be a symbolic "
                              "link or a FIFO: remove it (or choose another cache_dir).") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFileError(f"{str(path)!r} is {_kind(st.st_mode)}; the evaluation appends only to "
                                  "regular files: remove it (or choose another cache_dir).")
        data = text.encode("utf-8")
        while data:
            n = os.write(fd, data)
            data = data[n:]
    finally:
        os.close(fd)


def read_bounded(path: str | os.PathLike, limit: int, what: str = "file") -> bytes | None:
    """The bytes of the regular file ``path`` (``None`` when absent). A link, FIFO, device or
    folder is refused before it is opened; a file over ``limit`` bytes is refused unread."""
    path = Path(path)
    if not check_plain_or_absent(path, what):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _BINARY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UnsafeFileError(f"cannot open the {what} {str(path)!r} ({exc.strerror or exc}); it may have been "
                              "replaced by a link: remove it.") from exc
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFileError(f"the {what} {str(path)!r} is {_kind(st.st_mode)}; remove it.")
        if st.st_size > limit:
            raise TooLargeError(f"the {what} {str(path)!r} has {st.st_size} bytes, over the {limit} this reader "
                                  "accepts; it is not one the evaluation wrote: remove it.")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise TooLargeError(f"the {what} {str(path)!r} grew past {limit} bytes while read; remove it.")
    return data
