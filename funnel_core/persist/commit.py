"""The commit protocol: snapshots, pointer, journal and locks, shared by every saved object.

One mechanism, learnt from Lucene's ``IndexWriter.commit`` (immutable segment files plus an
atomically replaced ``segments_N``), for the BM25, clustered and dense indexes, the MoG router,
the query classifier and both frameworks' retrievers.

A persist folder ``path`` looks like this::

    path/
      .funnel-rag                  ownership marker (and lock file); written before anything else
      CURRENT                      pointer: names the committed snapshot (+ SHA-256 of its manifest)
      snapshot-00000007-9f1c2a4b/  the committed snapshot: immutable once written
        manifest.json              format, versions, SHA-256 and size of every file, settings
        ...                        the object's files

Saving (:func:`save_snapshot`):

1. refuse ``path`` if it is a file, or a non-empty folder without our marker (we never write
   into a folder we do not own); otherwise write the marker and take an exclusive lock;
2. write the object into a fresh ``.tmp-<random>`` folder, fsync every file, write the
   manifest, fsync it and every folder, rename the folder to ``snapshot-<seq>-<random>`` and
   fsync ``path``;
3. commit: write ``.CURRENT.tmp-<random>``, fsync it, ``os.replace`` it over ``CURRENT``, fsync
   ``path``;
4. only then remove the snapshots ``CURRENT`` no longer names, the temp folders of crashed
   saves and the journal's own temporary files (``.funnel-rag.journal.tmp-<16 hex>``) a
   crashed save left. Nothing else in ``path`` is touched.

A save killed at any point leaves ``CURRENT`` naming either the previous snapshot or the new one,
both complete; the next successful save removes what the crash left behind.

Loading (:func:`load_snapshot`) reads ``CURRENT`` once, checks its checksum, the manifest's
checksum, format and version (a newer or unknown version raises :class:`PersistError`), verifies
the SHA-256 of every file (``verify=False`` skips that for speed) and opens only files of that
snapshot, so a concurrent save can never be mixed in. If a concurrent save removed the snapshot
while it was being read, the load starts again from the new pointer.

Manifests are untrusted input: every setting read from one is validated by the constructor of
the object it configures (numbers finite and in range, token patterns checked for catastrophic
backtracking, ...), and ``NaN``/``Infinity`` are refused in manifests.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence, TypeVar

from funnel_core.errors import PersistError

__all__ = [
    "LAYOUT_VERSION",
    "save_snapshot",
    "load_snapshot",
    "snapshot_info",
    "snapshot_owner",
]

#: Version of the folder layout (marker, pointer, snapshot, manifest) written by this module.
LAYOUT_VERSION = 1
MARKER = ".funnel-rag"
POINTER = "CURRENT"
MANIFEST = "manifest.json"
_SNAPSHOT_RE = re.compile(r"^snapshot-(\d{8})-([0-9a-f]{8})$")
_TMP_RE = re.compile(r"^\.tmp-[0-9a-f]{16}$")
_POINTER_TMP_RE = re.compile(r"^\.CURRENT\.tmp-[0-9a-f]{16}$")
_MAX_POINTER_BYTES = 4096
_MAX_MANIFEST_BYTES = 64 * 2**20
_LOAD_ATTEMPTS = 30

T = TypeVar("T")

#: Test hook: called with the name of every step boundary of a save (the reliability suite kills
#: the process there). ``None`` in normal use.
_step_hook: Callable[[str], None] | None = None


def _step(name: str) -> None:
    if _step_hook is not None:
        _step_hook(name)


# -- fsync helpers -------------------------------------------------------------------------------
def _fsync_dir(path: Path) -> None:
    if os.name == "nt":  # directories cannot be opened for fsync on Windows
        return
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256_file(path: Path, fsync: bool = False, limit: int | None = None) -> tuple[str, int]:
    """SHA-256 and size of the file at ``path``; with ``fsync`` (saving) also flushed to disk.
    With ``limit`` (loading: the declared size) at most ``limit + 1`` bytes are read, so a file
    that grew (or never ends) is detected without reading it all."""
    h = hashlib.sha256()
    size = 0
    with (open(path, "rb+") if fsync else _open_plain(path)) as f:
        while chunk := f.read(1 << 20 if limit is None else min(1 << 20, limit + 1 - size)):
            h.update(chunk)
            size += len(chunk)
            if limit is not None and size > limit:
                break
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    return h.hexdigest(), size


_NO_HANG = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)


def _open_bookkeeping(f: Path, flags: int, what: str, mode: int = 0o644) -> int:
    """``os.open`` of one of our own files (marker, journal, readers' lock, pointer, manifest)
    with ``O_NOFOLLOW | O_NONBLOCK``: a symbolic link is not followed and a FIFO does not block
    (read: it opens at once; write: ``ENXIO``); anything but a regular file raises
    :class:`PersistError` naming it. ``FileNotFoundError`` propagates."""
    try:
        fd = os.open(f, flags | _NO_HANG, mode)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise PersistError(f"{what} ({str(f)!r}) cannot be opened ({exc}): it is a symbolic link, "
                           "a FIFO or another special file, not a regular file funnel-rag wrote; "
                           "the persist folder is damaged or tampered with. Remove it (or save "
                           "into a new folder).") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise PersistError(f"{what} ({str(f)!r}) is not a regular file (a FIFO, device, socket or "
                           "folder); the persist folder is damaged or tampered with. Remove it "
                           "(or save into a new folder).")
    return fd


def _write_durable(path: Path, data: bytes) -> None:
    fd = _open_bookkeeping(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, f"the file {path.name!r}")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


@contextlib.contextmanager
def _locked(marker: Path) -> Iterator[None]:
    """Exclusive advisory lock on the marker file (released by the kernel if we die)."""
    try:
        import fcntl
    except ImportError:  # Windows: saves to one folder must not run concurrently there
        yield
        return
    with os.fdopen(_open_bookkeeping(marker, os.O_RDONLY, f"the marker {MARKER!r}"), "rb") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


# -- ownership -----------------------------------------------------------------------------------
def _claim(path: Path) -> Path:
    """Make sure ``path`` is a folder we own; return its marker file."""
    if path.exists() and not path.is_dir():
        raise PersistError(
            f"{str(path)!r} is a file, not a folder; funnel-rag saves into a folder of its own. "
            "Pick another path (e.g. a new sub-folder) or move the file away.")
    marker = path / MARKER
    if os.path.lexists(marker):
        _check_plain(marker, path, f"the marker {MARKER!r}")
        return marker
    if path.is_dir():
        entries = [p.name for p in path.iterdir()]
        if entries:
            shown = ", ".join(sorted(entries)[:5]) + (", ..." if len(entries) > 5 else "")
            hint = (" It holds an index in the old (pre-snapshot) layout; load it with the "
                    "previous funnel-rag version and save it to a new folder." if MANIFEST in entries
                    and (path / MANIFEST).is_file() else "")
            raise PersistError(
                f"refusing to save into {str(path)!r}: the folder is not empty ({shown}) and is "
                f"not a funnel-rag persist folder (no {MARKER} marker), so saving could clobber "
                f"files we did not write. Save into an empty or new folder, e.g. "
                f"{str(path / 'funnel_rag')!r}.{hint}")
    path.mkdir(parents=True, exist_ok=True)
    _write_durable(marker, json.dumps({"funnel-rag": "persist folder", "layout": LAYOUT_VERSION})
                   .encode() + b"\n")
    _fsync_dir(path)
    if path.parent != path:
        with contextlib.suppress(OSError):
            _fsync_dir(path.parent)
    _step("marker_written")
    return marker


# -- the pointer ---------------------------------------------------------------------------------
def _pointer_bytes(payload: Mapping[str, Any]) -> bytes:
    body = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return body + b"\n" + hashlib.sha256(body).hexdigest().encode() + b"\n"


def _read_pointer(path: Path, what: str) -> dict[str, Any]:
    f = path / POINTER
    try:
        _check_plain(f, path, f"the pointer file {str(f)!r}")
        with _open_plain(f) as fh:
            data = fh.read(_MAX_POINTER_BYTES + 1)
    except FileNotFoundError:
        if not path.exists():
            raise PersistError(f"no {what} at {str(path)!r} (the folder does not exist); build one "
                               "and save it there first, or check the path.") from None
        if (path / MANIFEST).is_file():
            raise PersistError(
                f"{str(path)!r} holds a {what} in the old (pre-snapshot) layout, which this "
                "version does not read; rebuild it and save it again.") from None
        raise PersistError(f"no {what} at {str(path)!r} (missing {POINTER} and no snapshot: "
                           "nothing was ever committed there); build one and save it there first.") from None
    except IsADirectoryError:
        raise PersistError(f"{str(f)!r} is a folder, not a funnel-rag pointer file.") from None
    except NotADirectoryError:
        raise PersistError(f"no {what} at {str(path)!r}: it is a file, not a folder.") from None
    body, _, rest = data.partition(b"\n")
    try:
        payload = json.loads(body, parse_constant=_reject_constant)
    except ValueError:
        payload = None
    if (len(data) > _MAX_POINTER_BYTES or not isinstance(payload, dict)
            or data != _pointer_bytes(payload)):
        raise PersistError(f"the pointer file {str(f)!r} is corrupt (checksum mismatch); restore "
                           "the folder from a backup or rebuild the index and save it again.")
    name = payload.get("snapshot")
    if not isinstance(name, str) or not _SNAPSHOT_RE.match(name):
        raise PersistError(f"the pointer file {str(f)!r} names an invalid snapshot {name!r}.")
    return payload


def _check_plain(f: Path, root: Path, what: str, kind: str = "file") -> os.stat_result:
    """``lstat`` of ``f``, refusing a symbolic link (we never follow links in a persist folder:
    one could point anywhere, e.g. ``/dev/zero`` or another user's files) and anything but a
    regular file (``kind="file"``) or folder (``kind="dir"``): a FIFO would block the load
    forever, a device never ends. ``FileNotFoundError`` propagates."""
    st = os.lstat(f)
    if stat.S_ISLNK(st.st_mode):
        raise PersistError(f"{what} is a symbolic link ({str(f)!r} -> {os.readlink(f)!r}); funnel-rag "
                           f"never follows links inside a persist folder ({str(root)!r}). Replace the "
                           "link by a copy of what it points to, or save the object again.")
    ok = stat.S_ISDIR(st.st_mode) if kind == "dir" else stat.S_ISREG(st.st_mode)
    if not ok:
        raise PersistError(f"{what} ({str(f)!r}) is not a regular {kind} (a FIFO, device, socket or "
                           f"{'file' if kind == 'dir' else 'folder'}); the persist folder is damaged "
                           "or tampered with: save the object again.")
    return st


def _open_plain(f: Path) -> Any:
    """Open a file checked by :func:`_check_plain` without following a link swapped in since
    and without blocking on a FIFO; re-check that it is a regular file."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(f, flags)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise PersistError(f"cannot open {str(f)!r} ({exc}); it may be a symbolic link: save the "
                           "object again.") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise PersistError(f"{str(f)!r} is not a regular file; save the object again.")
    return os.fdopen(fd, "rb")


def _read_bounded(f: Path, limit: int) -> bytes:
    with _open_plain(f) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise PersistError(f"{str(f)!r} is larger than {limit} bytes; it is not a funnel-rag "
                           "manifest (damaged or tampered with): save the object again.")
    return data


def _check_tree(folder: Path, root: Path) -> None:
    """Refuse any symbolic link or special file anywhere in a snapshot folder (readers open
    files by name, so a link left unlisted in the manifest must not be reachable either)."""
    _check_plain(folder, root, f"the snapshot {folder.name!r}", "dir")
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        for name in dirnames:
            _check_plain(Path(dirpath) / name, root, f"the folder {name!r}", "dir")
        for name in filenames:
            _check_plain(Path(dirpath) / name, root, f"the file {name!r}")


def _reject_constant(token: str) -> Any:
    raise ValueError(f"{token} is not allowed in a funnel-rag manifest")


# -- saving --------------------------------------------------------------------------------------
def save_snapshot(path: str | os.PathLike, fmt: str, version: int,
                  write: Callable[[Path], Mapping[str, Any]], owner: str | None = None,
                  overwrite: bool = True) -> Path:
    """Commit a new snapshot of an object to the persist folder ``path``.

    Args:
        path: The persist folder (created if missing; must be empty or one of ours).
        fmt: The object's format name, e.g. ``"funnel-rag.bm25"``. A folder whose committed
            snapshot holds another format is refused (a BM25 save never replaces a dense index).
        version: The object's format version.
        write: ``write(folder) -> settings``: writes the object's files into ``folder`` and
            returns its settings (JSON-safe), stored in the manifest under ``"meta"``.
        owner: An id of the saving object, recorded in the manifest. With ``overwrite=False``
            a folder whose committed snapshot records another owner is refused (two objects
            persisted into one folder by mistake would otherwise replace each other).
        overwrite: Replace a snapshot saved by another owner.

    Returns:
        The committed snapshot folder.

    Ownership is recorded, not guessed from names: every temp folder, snapshot and pointer temp
    file is written to the journal ``.funnel-rag.journal`` (fsynced) before it is created, and
    the clean-up after a commit removes only journal entries and the snapshot the previous
    pointer named, never a user's ``snapshot-00000099-deadbeef/`` that merely looks like ours.
    """
    path = Path(path)
    marker = _claim(path)
    with _locked(marker):
        _check_bookkeeping(path)
        try:
            before: str | None = _read_pointer(path, "object")["snapshot"]
        except PersistError:
            before = None
        _refuse_other_kind(path, before, fmt, owner, overwrite)
        journal = _Journal(path)
        tmp = path / f".tmp-{secrets.token_hex(8)}"
        journal.add(tmp.name)
        tmp.mkdir()
        _step("tmp_created")
        try:
            meta = write(tmp)
            _step("files_written")
            files: dict[str, dict[str, Any]] = {}
            dirs = [tmp]
            for p in sorted(tmp.rglob("*")):
                if p.is_dir():
                    dirs.append(p)
                elif p.is_file():
                    digest, size = _sha256_file(p, fsync=True)
                    files[p.relative_to(tmp).as_posix()] = {"sha256": digest, "size": size}
            _step("files_synced")
            manifest = {"format": fmt, "version": int(version), "layout": LAYOUT_VERSION,
                        "files": files, "meta": dict(meta or {})}
            if owner is not None:
                manifest["owner"] = str(owner)
            try:
                data = json.dumps(manifest, indent=1, sort_keys=True, allow_nan=False).encode()
            except ValueError as exc:
                raise ValueError(f"cannot save: a setting of this {fmt} is not finite ({exc}).") from exc
            _write_durable(tmp / MANIFEST, data)
            for d in reversed(dirs):
                _fsync_dir(d)
            _step("manifest_written")
            seq = 1 + max([int(m.group(1)) for m in map(_SNAPSHOT_RE.match, _listdir(path)) if m],
                          default=0)
            name = f"snapshot-{seq:08d}-{secrets.token_hex(4)}"
            journal.add(name)
            os.rename(tmp, path / name)
            _fsync_dir(path)
            _step("snapshot_renamed")
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        ptr_tmp = path / f".CURRENT.tmp-{secrets.token_hex(8)}"
        journal.add(ptr_tmp.name)
        try:
            _write_durable(ptr_tmp, _pointer_bytes({
                "snapshot": name, "format": fmt, "manifest_sha256": hashlib.sha256(data).hexdigest()}))
            _step("pointer_written")
            os.replace(ptr_tmp, path / POINTER)
            _step("pointer_replaced")
        except BaseException:
            with contextlib.suppress(OSError):
                ptr_tmp.unlink()
            raise
        # committed: from here on nothing may raise (the new snapshot is what CURRENT names)
        _after_commit(path, journal, name, before)
    return path / name


def _check_bookkeeping(path: Path) -> None:
    """Refuse (:class:`PersistError`, naming it) a pointer, journal or readers' lock file that
    exists and is not a regular file (a FIFO, a symbolic link, a device, a folder): a save never
    blocks on one, nor replaces what it did not write."""
    for name, what in ((POINTER, "the pointer file"), (JOURNAL, "the journal"),
                       (READERS, "the readers' lock")):
        try:
            _check_plain(path / name, path, f"{what} {name!r}")
        except FileNotFoundError:
            continue


def _after_commit(path: Path, journal: "_Journal", name: str, before: str | None) -> None:
    try:
        _fsync_dir(path)
        _step("committed")
    except OSError as exc:
        warnings.warn(f"the save to {str(path)!r} committed snapshot {name!r}, but syncing the "
                      f"folder afterwards failed ({exc}); after a power loss the previous snapshot "
                      "may be the one loaded. Check the disk.", RuntimeWarning, stacklevel=3)
    try:
        _cleanup(path, journal, name, before)
    except OSError as exc:  # best effort: what is left is removed by the next save
        warnings.warn(f"the save to {str(path)!r} committed, but cleaning up older snapshots "
                      f"failed ({exc}); the next save retries.", RuntimeWarning, stacklevel=3)


def _cleanup(path: Path, journal: "_Journal", name: str, before: str | None) -> None:
    """Remove what our records say we wrote and no longer need: journal entries (crashed
    saves' temp folders and pointer temps, superseded snapshots) and the snapshot the previous
    pointer named. Snapshots are removed only while no reader holds the readers' lock (it skips
    the removal otherwise: the entries stay in the journal for the next save), and only when
    the previous pointer was readable or the snapshot was never committed (a lost ``CURRENT``
    leaves every committed snapshot in place, so nothing recoverable is deleted)."""
    recorded, committed = journal.names()
    owned = recorded | ({before} if before else set())
    keep = {name}
    readers = _readers_lock(path, blocking=False)
    try:
        for entry in sorted(owned - keep):
            full = path / entry
            if _SNAPSHOT_RE.match(entry):
                if readers is None or (before is None and entry in committed):
                    keep.add(entry)
                    continue
                if full.is_dir() and not full.is_symlink():
                    shutil.rmtree(full, ignore_errors=True)
                    _step("cleanup")
            elif _TMP_RE.match(entry):
                if full.is_dir() and not full.is_symlink():
                    shutil.rmtree(full, ignore_errors=True)
                    _step("cleanup")
            elif _POINTER_TMP_RE.match(entry):
                with contextlib.suppress(FileNotFoundError):
                    full.unlink()
            if full.exists() or full.is_symlink():
                keep.add(entry)
    finally:
        if readers is not None:
            _unlock(readers)
    journal.reset(keep, (committed & keep) | {name})
    _fsync_dir(path)
    _step("done")


def _manifest_of(path: Path, name: str) -> dict[str, Any] | None:
    """The manifest of the snapshot ``name`` when it can be read (bounded, no links), else
    ``None``."""
    try:
        _check_plain(path / name, path, f"the snapshot {name!r}", "dir")
        manifest = json.loads(_read_bounded(path / name / MANIFEST, _MAX_MANIFEST_BYTES),
                              parse_constant=_reject_constant)
    except (OSError, ValueError, RecursionError, PersistError):
        return None
    return manifest if isinstance(manifest, dict) else None


def _refuse_other_kind(path: Path, before: str | None, fmt: str, owner: str | None,
                       overwrite: bool) -> None:
    """Refuse a save of ``fmt`` into a folder that holds another kind of object (or, with
    ``overwrite=False``, another owner's). ``before`` is the snapshot ``CURRENT`` names; when
    the pointer is lost or unreadable, the committed snapshots a recovery could load (the
    journal's, see :func:`_recover`) are checked instead, so a lost ``CURRENT`` never lets a
    dense index replace a BM25 index (nor another owner's retriever)."""
    if before is not None:
        names = [before]
    else:
        names = _committed_snapshots(path)
    manifests = [m for m in (_manifest_of(path, n) for n in names) if m is not None]
    if not manifests:
        return  # nothing committed, or only damaged snapshots: the new save replaces them
    for m in manifests:
        got = m.get("format")
        if isinstance(got, str) and got != fmt:
            raise PersistError(
                f"refusing to save a {fmt!r} into {str(path)!r}: it holds a {got!r}"
                f"{'' if before else f' (in {POINTER}-less snapshots; the pointer is missing or damaged)'}"
                ", and one folder holds one object. Save into another folder, or delete this one "
                "first if you mean to replace it.")
    manifest = manifests[0]  # the newest readable one
    got = manifest.get("format")
    theirs = manifest.get("owner")
    if not overwrite and owner is not None and isinstance(theirs, str) and theirs != owner:
        raise PersistError(
            f"refusing to save into {str(path)!r}: it holds a {got!r} persisted by another object "
            "(two objects persisted into one folder would replace each other). Persist this one "
            "into another folder, or pass overwrite=True to replace what is there.")


def snapshot_owner(manifest: Mapping[str, Any]) -> str | None:
    """The ``owner`` recorded by :func:`save_snapshot` (``None`` if none)."""
    owner = manifest.get("owner")
    return owner if isinstance(owner, str) and len(owner) <= 128 else None


JOURNAL = ".funnel-rag.journal"
READERS = ".funnel-rag.readers"
_JOURNAL_TMP_RE = re.compile(r"^" + re.escape(JOURNAL) + r"\.tmp-[0-9a-f]{16}$")


class _Journal:
    """Names of the entries this folder's saves created, one per line, fsynced before the entry
    exists (so a save killed at any point leaves a record of what it left behind)."""

    def __init__(self, path: Path) -> None:
        self.file = path / JOURNAL

    def remove_stale_temps(self) -> None:
        """Remove the journal's own temporary files left by a save killed between writing one
        and renaming it (:meth:`reset`). Called under the save's exclusive lock, so no other
        save is writing one; only regular files named exactly as :meth:`reset` names them."""
        for entry in _listdir(self.file.parent):
            if _JOURNAL_TMP_RE.match(entry):
                with contextlib.suppress(OSError):
                    if stat.S_ISREG(os.lstat(self.file.parent / entry).st_mode):
                        os.unlink(self.file.parent / entry)

    def names(self) -> tuple[set[str], set[str]]:
        """(every name recorded, the snapshot names recorded as committed)."""
        try:
            _check_plain(self.file, self.file.parent, "the journal")
            raw = _read_bounded(self.file, 16 * 2**20).decode("ascii", "replace")
        except (FileNotFoundError, PersistError):
            return set(), set()
        ok = (_SNAPSHOT_RE, _TMP_RE, _POINTER_TMP_RE)
        names, committed = set(), set()
        for line in raw.splitlines():
            done = line.startswith("committed ")
            name = line[len("committed "):] if done else line
            if any(r.match(name) for r in ok):
                names.add(name)
                if done:
                    committed.add(name)
        return names, committed

    def add(self, name: str) -> None:
        fd = _open_bookkeeping(self.file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, f"the journal {JOURNAL!r}")
        try:
            os.write(fd, name.encode("ascii") + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)

    def reset(self, names: set[str], committed: set[str]) -> None:
        self.remove_stale_temps()
        tmp = self.file.with_name(f"{JOURNAL}.tmp-{secrets.token_hex(8)}")
        lines = [f"committed {n}" if n in committed else n for n in sorted(names)]
        _write_durable(tmp, "".join(f"{line}\n" for line in lines).encode("ascii"))
        os.replace(tmp, self.file)


def _readers_lock(path: Path, blocking: bool, shared: bool = False,
                  refuse: bool = False) -> int | None:
    """A lock on ``.funnel-rag.readers``: loads hold it shared while they read a snapshot, the
    clean-up exclusive (non-blocking: it skips removing snapshots while anyone reads). Returns
    the locked fd, or ``None`` when the lock is unavailable (held, or no such file/flock). The
    file is opened no-follow and non-blocking; with ``refuse``, one that is not a regular file
    (a FIFO, a link) raises :class:`PersistError` instead of returning ``None``."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        return None
    f = path / READERS
    what = f"the readers' lock {READERS!r}"
    try:
        fd = _open_bookkeeping(f, os.O_RDONLY | (0 if shared else os.O_CREAT), what)
    except PersistError:
        if refuse:
            raise
        return None
    except OSError:
        return None
    op = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if blocking else fcntl.LOCK_NB)
    try:
        fcntl.flock(fd, op)
    except OSError:
        os.close(fd)
        return None
    return fd


def _unlock(fd: int) -> None:
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _listdir(path: Path) -> list[str]:
    return sorted(os.listdir(path))


def _current_name(path: Path) -> str | None:
    try:
        return _read_pointer(path, "object")["snapshot"]
    except PersistError:
        return None


# -- loading -------------------------------------------------------------------------------------
def _check_relpath(rel: Any, folder: Path) -> Path:
    if (not isinstance(rel, str) or not rel or rel.startswith("/") or "\\" in rel
            or any(part in ("", ".", "..") for part in rel.split("/"))):
        raise PersistError(f"the manifest in {str(folder)!r} lists an unsafe file name {rel!r}.")
    return folder / rel


def _open(path: Path, fmt: str | Sequence[str], max_version: int, what: str,
          verify: bool, pointer: dict[str, Any] | None = None) -> tuple[Path, dict[str, Any], str]:
    recovering = pointer is not None
    if pointer is None:
        pointer = _read_pointer(path, what)
    name = pointer["snapshot"]
    folder = path / name
    mfile = folder / MANIFEST
    try:
        _check_tree(folder, path)
        data = _read_bounded(mfile, _MAX_MANIFEST_BYTES)
    except FileNotFoundError:
        raise _Vanished(name, f"the committed snapshot {str(folder)!r} is missing (deleted by "
                              "hand?); rebuild and save again.") from None
    if not recovering and hashlib.sha256(data).hexdigest() != pointer.get("manifest_sha256"):
        raise PersistError(f"the manifest {str(mfile)!r} does not match its checksum in "
                           f"{POINTER}: it is corrupt; rebuild and save again.")
    try:
        manifest = json.loads(data, parse_constant=_reject_constant)
    except ValueError as exc:
        raise PersistError(f"the manifest {str(mfile)!r} is corrupt ({exc}).") from exc
    fmts = (fmt,) if isinstance(fmt, str) else tuple(fmt)
    if not isinstance(manifest, dict) or manifest.get("format") not in fmts:
        got = manifest.get("format") if isinstance(manifest, dict) else None
        raise PersistError(f"{str(path)!r} holds {got!r}, not a {what} ({' or '.join(fmts)}); "
                           f"point to the folder you saved the {what} in.")
    for key, limit in (("layout", LAYOUT_VERSION), ("version", max_version)):
        v = manifest.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise PersistError(f"the {what} at {str(path)!r} has an invalid {key} {v!r} in its "
                               "manifest; it was not written by funnel-rag, or it is corrupt.")
        if v > limit:
            raise PersistError(f"the {what} at {str(path)!r} was written by a newer funnel-rag "
                               f"({key} {v}; this version reads up to {limit}); upgrade funnel-rag "
                               "(pip install -U funnel-rag) to load it.")
    files = manifest.get("files")
    if not isinstance(files, dict) or not isinstance(manifest.get("meta"), dict):
        raise PersistError(f"the manifest {str(mfile)!r} is incomplete (no file list or settings).")
    for rel, info in files.items():
        f = _check_relpath(rel, folder)
        if not isinstance(info, dict) or not isinstance(info.get("sha256"), str):
            raise PersistError(f"the manifest {str(mfile)!r} has no checksum for {rel!r}.")
        declared = info.get("size")
        if isinstance(declared, bool) or not isinstance(declared, int) or declared < 0:
            raise PersistError(f"the manifest {str(mfile)!r} has no valid size for {rel!r}.")
        try:
            st = _check_plain(f, path, f"the file {rel!r}")
            if st.st_size != declared:
                raise PersistError(f"checksum mismatch for {str(f)!r}: it has {st.st_size} bytes, "
                                   f"its manifest says {declared}; the file is corrupt or was changed after saving; rebuild and "
                                   "save again (or restore a backup).")
            if not verify:
                continue
            digest, size = _sha256_file(f, limit=declared)
        except FileNotFoundError:
            raise _Vanished(name, f"the file {str(f)!r} listed in the manifest is missing; the "
                                  "snapshot is damaged: rebuild and save again.") from None
        if digest != info["sha256"] or size != info.get("size"):
            raise PersistError(f"checksum mismatch for {str(f)!r}: the file is corrupt or was "
                               "changed after saving; rebuild and save again (or restore a backup).")
    return folder, manifest, name


class _Vanished(Exception):
    """The snapshot being read was removed by a concurrent save."""


def load_snapshot(path: str | os.PathLike, fmt: str | Sequence[str], max_version: int, what: str,
                  read: Callable[[Path, dict[str, Any]], T], verify: bool = True) -> T:
    """Open the committed snapshot of ``path`` and rebuild the object with ``read``.

    Args:
        path: The persist folder.
        fmt: Accepted format name(s).
        max_version: The newest format version this code reads.
        what: What the object is, for error messages ("BM25 index").
        read: ``read(snapshot_folder, manifest) -> object``; settings are ``manifest["meta"]``
            (untrusted: validate them). Errors other than :class:`PersistError` are wrapped.
        verify: Check the SHA-256 of every file (default). ``False`` only checks that they exist.
    """
    path = Path(path)
    # a shared lock on the readers' file: a concurrent save does not remove the snapshot we
    # read (its clean-up skips while we hold it), so the load does not have to chase pointers
    readers = _readers_lock(path, blocking=True, shared=True, refuse=True) if path.is_dir() else None
    try:
        if _pointer_lost(path):
            return _recover(path, fmt, max_version, what, read)
        return _load_current(path, fmt, max_version, what, read, verify)
    finally:
        if readers is not None:
            _unlock(readers)


def _load_current(path: Path, fmt: str | Sequence[str], max_version: int, what: str,
                  read: Callable[[Path, dict[str, Any]], T], verify: bool) -> T:
    last: BaseException | None = None
    for attempt in range(_LOAD_ATTEMPTS):
        if attempt:  # back off: saves are seconds apart at most, and we lost a race with one
            time.sleep(min(0.002 * 2 ** attempt, 0.25))
        # A FileNotFoundError while opening or reading means either damage (the pointer still
        # names the same snapshot: raise) or a concurrent save that committed a newer snapshot
        # and removed this one (the pointer moved on: read the new one).
        try:
            folder, manifest, name = _open(path, fmt, max_version, what, verify)
        except _Vanished as exc:
            if _current_name(path) == exc.args[0]:
                raise PersistError(exc.args[1]) from None
            last = exc
            continue
        try:
            return read(folder, manifest)
        except Exception as exc:
            if _current_name(path) != name:
                last = exc
                continue  # removed under us by a concurrent save: read the new one
            if isinstance(exc, PersistError):
                raise
            raise PersistError(f"the {what} at {str(path)!r} is corrupt or incomplete "
                               f"({type(exc).__name__}: {exc}); rebuild it and save it again.") from exc
    raise PersistError(f"the {what} at {str(path)!r} kept changing while it was being loaded "
                       f"({_LOAD_ATTEMPTS} attempts); retry when saves to it have stopped.") from last


def _snapshot_dirs(path: Path) -> list[str]:
    """Snapshot folders in ``path`` (real folders, not links), newest first."""
    out = []
    for entry in _listdir(path):
        m = _SNAPSHOT_RE.match(entry)
        if m and stat.S_ISDIR(os.lstat(path / entry).st_mode):
            out.append((int(m.group(1)), entry))
    return [e for _, e in sorted(out, reverse=True)]


def _committed_snapshots(path: Path) -> list[str]:
    """Snapshot folders a pointer named once, newest first: the journal records them as
    committed (a folder written before the journal existed has none, so every snapshot there is
    one); a snapshot a killed save renamed but never committed is not among them."""
    candidates = _snapshot_dirs(path)
    journal = _Journal(path)
    if journal.file.exists():
        committed = journal.names()[1]
        candidates = [n for n in candidates if n in committed]
    return candidates


def _pointer_lost(path: Path) -> bool:
    return (path.is_dir() and (path / MARKER).is_file() and not os.path.lexists(path / POINTER)
            and bool(_snapshot_dirs(path)))


def _recover(path: Path, fmt: str | Sequence[str], max_version: int, what: str,
             read: Callable[[Path, dict[str, Any]], T]) -> T:
    """``CURRENT`` is missing but snapshots are there: load the newest one that is complete and
    whose every file verifies (SHA-256), and say so. Nothing is deleted (the next save keeps
    every snapshot a lost pointer could have named)."""
    errors = []
    candidates = _committed_snapshots(path)
    if not candidates:
        raise PersistError(f"no {what} at {str(path)!r} (missing {POINTER} and no committed snapshot: "
                           "nothing was ever committed there); build one and save it there first.")
    for name in candidates:
        try:
            folder, manifest, _ = _open(path, fmt, max_version, what, True,
                                        pointer={"snapshot": name})
            obj = read(folder, manifest)
        except Exception as exc:  # damaged or incomplete: try the next older one
            errors.append(f"{name}: {exc}")
            continue
        warnings.warn(f"{str(path)!r} has no {POINTER} pointer (deleted or lost); loaded the newest "
                      f"complete, verified snapshot {name!r}. Save the object again to write a new "
                      "pointer; nothing was deleted.", RuntimeWarning, stacklevel=4)
        return obj
    raise PersistError(f"no {what} at {str(path)!r}: its {POINTER} pointer is missing and no snapshot "
                       f"in it is complete and verified ({'; '.join(errors)[:600]}); restore the "
                       "folder from a backup, or rebuild and save again into a new folder.")


def snapshot_info(path: str | os.PathLike) -> dict[str, Any]:
    """The committed snapshot's name and manifest (no verification), for inspection."""
    path = Path(path)
    pointer = _read_pointer(path, "persisted object")
    folder = path / pointer["snapshot"]
    _check_tree(folder, path)
    manifest = json.loads(_read_bounded(folder / MANIFEST, _MAX_MANIFEST_BYTES).decode("utf-8"))
    return {"snapshot": pointer["snapshot"], **manifest}
