"""File-system safety: reading the user's small text files, and what a profile run writes (atomic
files and the output model repository).

Results and reports are replaced whole (temp file, fsync, rename, fsync of the folder), so a crash
or a full disk leaves the previous file, never half of one. The output model repository is the one
folder a run may delete: only when it carries the marker this tool writes when it creates the
folder, never when it overlaps the user's files, and never while another run holds its lock.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from analyzer.errors import AnalyzerError

MARKER = ".model-analyzer-output"
LOCK = ".model-analyzer.lock"
MARKER_TEXT = (
    "This folder was created by model-analyzer as an output model repository.\n"
    "`model-analyzer profile --override-output-model-repository` may delete everything in it;\n"
    "a folder without this file is never deleted.\n"
)


class FolderError(AnalyzerError):
    """A folder cannot be used as asked; the message names it and says what to do."""


class UserFileError(AnalyzerError):
    """A file the user named cannot be read as text: where (the path, maybe a line), what is
    wrong, and what to do, kept apart for the repository check's findings."""

    def __init__(self, where: str, problem: str, fix: str) -> None:
        super().__init__(f"{where}: {problem}; {fix}")
        self.where, self.problem, self.fix = where, problem, fix


# ---- the user's text files ----------------------------------------------------------------------
TEXT_LIMIT = 16 << 20  # a config or YAML file larger than this is not one


def read_user_bytes(path: Path | str, limit: int = TEXT_LIMIT) -> bytes:
    """A small file's bytes. Only a regular file is read (a FIFO would block for ever, /dev/zero
    never end), and at most `limit` bytes."""
    path = Path(path)
    plain = "make it a plain file"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        if path.is_symlink():
            raise UserFileError(str(path), f"is a broken symlink (to '{os.readlink(path)}')",
                                "point it at the file, or put the file there") from None
        raise UserFileError(str(path), f"cannot be read ({err.strerror})",
                            "check that it exists and is readable") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
        raise UserFileError(str(path), f"is {kind}", plain)
    with os.fdopen(fd, "rb") as file:
        data = file.read(limit + 1)
    if len(data) > limit:
        raise UserFileError(str(path), f"is over {limit >> 20} MiB", plain)
    return data


def read_user_text(path: Path | str, limit: int = TEXT_LIMIT) -> str:
    """A small UTF-8 text file's content (see read_user_bytes); a byte that is not UTF-8, or a
    byte-order mark, is named."""
    data = read_user_bytes(path, limit)
    if data.startswith(b"\xef\xbb\xbf"):
        raise UserFileError(str(path), "starts with a UTF-8 byte-order mark",
                            "save it without one")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise UserFileError(
            f"{path}, line {line}",
            f"is not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start})",
            "save it as UTF-8",
        ) from None


# ---- atomic files -------------------------------------------------------------------------------
def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    """`path` holds either its old content or `data`, whatever happens during the write."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; results are ordinary files
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: Path | str, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def _read_umask() -> int:
    """Read once at import: setting the umask to read it is not thread-safe."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def _fsync_dir(folder: Path) -> None:
    """The rename itself survives a power cut only once the folder's entry is on disk."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---- overlap checks -----------------------------------------------------------------------------
def _related(a: Path, b: Path) -> str:
    """How `a` relates to `b`: "is", "contains", "inside" or ""."""
    if a == b:
        return "is"
    if a in b.parents:
        return "contains"
    if b in a.parents:
        return "inside"
    return ""


def refuse_overlap(what: str, path: Path, others: dict[str, tuple[Path, set[str]]]) -> None:
    """Raise when `path` (named `what`) relates to one of `others` (name -> (path, the relations
    refused)); paths are compared with symlinks resolved."""
    real = path.resolve()
    for name, (other, refused) in others.items():
        relation = _related(real, other.resolve())
        if relation in refused:
            words = {"is": "is", "contains": "contains", "inside": "lies inside"}[relation]
            raise FolderError(
                f"{what} '{path}' {words} the {name} '{other}'; choose a folder of its own "
                "that overlaps none of the run's other folders"
            )


# ---- the output model repository ----------------------------------------------------------------
@dataclass
class OutputFolder:
    """The output model repository, locked for one run (release() when the run ends)."""

    path: Path
    marked: bool = False
    _fd: int | None = field(default=None, repr=False)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def claim_output_folder(path: Path, override: bool, resuming: bool) -> OutputFolder:
    """Create or reuse `path` as a run's output model repository and lock it.

    A folder that does not exist, or an empty one, becomes ours (marked). A non-empty folder is
    reused when the run resumes into it, replaced with `override` only when it carries our marker,
    and otherwise refused with every file kept."""
    if path.exists() and not path.is_dir():
        raise FolderError(f"output model repository '{path}' is a file, not a folder; choose "
                          "another --output-model-repository-path")  # fmt: skip
    path.mkdir(parents=True, exist_ok=True)
    marked = (path / MARKER).is_file()
    entries = [p for p in path.iterdir() if p.name not in (MARKER, LOCK)]
    if entries and not marked and not resuming:
        raise FolderError(
            f"output model repository '{path}' is not empty and was not created by "
            f"model-analyzer (it has no {MARKER} file), so it is never replaced, not even with "
            "--override-output-model-repository; every file in it is kept: choose another "
            "--output-model-repository-path, or empty or delete it yourself"
        )
    if entries and marked and not override and not resuming:
        raise FolderError(
            f"output model repository '{path}' already exists; pass "
            "--override-output-model-repository to replace it"
        )
    folder = OutputFolder(path, marked, _lock(path))
    try:
        if entries and marked and override:
            _empty(path)
        if not entries and not marked:
            atomic_write_text(path / MARKER, MARKER_TEXT)
            folder.marked = True
    except BaseException:
        folder.release()
        raise
    return folder


def _lock(path: Path) -> int:
    fd = os.open(path / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise FolderError(
            f"output model repository '{path}' is in use by another model-analyzer run (it "
            f"holds {path / LOCK}); wait for that run to end or choose another "
            "--output-model-repository-path"
        ) from None
    return fd


def _empty(path: Path) -> None:
    """Everything but the marker and the lock we hold: the folder itself stays, so no other run
    can take it between a delete and a re-create."""
    for entry in path.iterdir():
        if entry.name in (MARKER, LOCK):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
