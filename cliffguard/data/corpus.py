"""Documents of a corpus directory, streamed one at a time: one file = one document.

Files are visited in sorted path order (the trainer's ``trainer.data`` order for a named
directory). A file that is not text (a NUL byte in its first 8 KiB, or not valid UTF-8) is
skipped and counted, never an error: corpora hold stray images and archives.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

# Installed packages are not the corpus (the trainer's default stdlib corpus leaves them out too: trainer/data.py).
_SKIP_DIRS = {"__pycache__", ".git", "site-packages", "dist-packages"}


@dataclass(frozen=True, slots=True)
class Document:
    path: str
    """Resolved absolute path (the manifest's key; the trainer resolves its files the same way)."""
    text: str


@dataclass(slots=True)
class CorpusStats:
    files: int = 0
    documents: int = 0
    skipped_binary: list[str] = field(default_factory=list)
    skipped_unreadable: list[str] = field(default_factory=list)
    bytes: int = 0


def corpus_files(root: str | Path) -> list[Path]:
    """Sorted files under ``root`` (a directory, recursively, or one file); a clear error when missing."""
    root = Path(root)
    if not root.exists():
        raise ValueError(f"corpus: {str(root)!r} does not exist")
    if root.is_file():
        return [root.resolve()]
    files = sorted(
        f.resolve() for f in root.rglob("*")
        if f.is_file() and not _SKIP_DIRS.intersection(f.relative_to(root).parts[:-1])
    )
    if not files:
        raise ValueError(f"corpus: {str(root)!r} holds no files")
    return files


def decode_text(data: bytes) -> str | None:
    """The text of a file's bytes, or None when they are binary."""
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def read_document(path: str | Path) -> Document | None:
    try:
        text = decode_text(Path(path).read_bytes())
    except OSError:
        return None
    return None if text is None else Document(path=str(path), text=text)


def iter_documents(files: list[Path], stats: CorpusStats) -> Iterator[Document]:
    """Text documents of ``files``; binary and unreadable ones are counted in ``stats``."""
    for f in files:
        stats.files += 1
        try:
            data = f.read_bytes()
        except OSError:
            stats.skipped_unreadable.append(str(f))
            continue
        text = decode_text(data)
        if text is None:
            stats.skipped_binary.append(str(f))
            continue
        stats.documents += 1
        stats.bytes += len(data)
        yield Document(path=str(f), text=text)
