"""One storage layer for local paths and ``gs://`` URIs: a bucket through TensorFlow's ``tf.io.gfile`` (what the
training's own reads and checkpoints use), a local path through the standard library.

Every step reads and writes through these functions, so the same code runs on a laptop folder and on a
bucket. Only a ``gs://`` prefix means a bucket: a local path that happens to contain "gs" stays local. A step
that touches no bucket and trains nothing never imports TensorFlow (about 4 s a process here).
Writes that must never be seen half-done go to a temporary name and are renamed when complete.
"""

from __future__ import annotations

import bz2
import contextlib
import functools
import glob as local_glob
import gzip
import io
import lzma
import os
import posixpath
import re
import shutil
import sys
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from backports import zstd

from components.lib.errors import InvalidParameter, ServiceFailed

REMOTE_SCHEMES = ("gs",)
TEMP_SUFFIX = ".partial"
# compressed files, by suffix: the standard library's readers (zstd: its backport of Python 3.14's, PEP 784;
# python-zstandard's stream reader ends a truncated file without an error)
DECOMPRESSORS: dict[str, Any] = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open, ".zst": zstd.open}
# zstd --long=31 (what large corpora are often compressed with) needs the largest window the format allows
READ_OPTIONS: dict[str, dict[str, Any]] = {".zst": {"options": {zstd.DecompressionParameter.window_log_max: 31}}}
# what they raise on a truncated or corrupt file
DECOMPRESSION_ERRORS = (EOFError, OSError, lzma.LZMAError, zstd.ZstdError)


@functools.cache
def gfile() -> Any:
    """``tf.io.gfile``, imported on first use so that ``--help`` and compiling stay fast."""
    import tensorflow as tf

    return tf.io.gfile


def is_remote(uri: str) -> bool:
    return uri.startswith(tuple(f"{scheme}://" for scheme in REMOTE_SCHEMES))


def check_uri(parameter: str, uri: str) -> str:
    """Returns ``uri`` if it is a local path or a ``gs://`` URI, else raises naming ``parameter``."""
    if not uri or not uri.strip():
        raise InvalidParameter(parameter, uri, "a local path or a gs:// URI is required")
    if "://" in uri and not is_remote(uri):
        scheme = uri.split("://", 1)[0]
        raise InvalidParameter(
            parameter, uri, f"unsupported URI scheme {scheme!r}; use a local path or gs://bucket/path"
        )
    if is_remote(uri) and not bucket_name(uri):
        raise InvalidParameter(parameter, uri, "a gs:// URI needs a bucket name: gs://bucket/path")
    return uri


def join(base: str, *parts: str) -> str:
    return posixpath.join(base, *parts) if is_remote(base) else os.path.join(base, *parts)


def dirname(uri: str) -> str:
    return posixpath.dirname(uri) if is_remote(uri) else os.path.dirname(uri)


def basename(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1]


LOOP_ITERATION = re.compile(r"for-loop-\d+-iteration-\d+")  # kfp.local's folder of one loop iteration's tasks


def relocate(uri: str, root: str) -> str:
    """``uri`` moved under ``root``, keeping its run, task and output name (its last three parts; four in a
    kfp.local loop iteration's folder, so that every run keeps its data in its own folder); ``uri`` itself when
    ``root`` is empty."""
    if not root:
        return uri
    parts = uri.replace(os.sep, "/").rstrip("/").split("/")
    kept = 4 if len(parts) >= 3 and LOOP_ITERATION.fullmatch(parts[-3]) else 3
    return join(root, *parts[-kept:])


def bucket_name(uri: str) -> str:
    """The bucket of a gs:// URI ("b" of gs://b/path)."""
    return uri[len("gs://") :].split("/", 1)[0]


def is_bucket(uri: str) -> bool:
    """Whether ``uri`` is a bucket itself (gs://name), which TensorFlow asks about with a request for the bucket's
    metadata, a permission the README's object roles do not grant: the steps take a bucket as an existing folder
    (if it does not exist, the first write says so)."""
    return is_remote(uri) and uri.rstrip("/") == f"gs://{bucket_name(uri)}"


def exists(uri: str) -> bool:
    if is_remote(uri):
        return is_bucket(uri) or gfile().exists(uri)
    return os.path.exists(uri)


def isdir(uri: str) -> bool:
    if is_remote(uri):
        return is_bucket(uri) or gfile().isdir(uri)
    return os.path.isdir(uri)


def glob(pattern: str) -> list[str]:
    if is_remote(pattern):
        return sorted(gfile().glob(pattern))
    return sorted(local_glob.glob(pattern, include_hidden=True))  # gfile's * matches a leading dot too


def listdir(uri: str) -> list[str]:
    if not isdir(uri):
        return []
    names = gfile().listdir(uri) if is_remote(uri) else os.listdir(uri)
    return sorted(name.rstrip("/") for name in names)


def size(uri: str) -> int:
    return gfile().stat(uri).length if is_remote(uri) else os.path.getsize(uri)


def modified_seconds(uri: str) -> float:
    """When the file ``uri`` was last written, in seconds since the epoch."""
    return gfile().stat(uri).mtime_nsec / 1e9 if is_remote(uri) else os.path.getmtime(uri)


def makedirs(uri: str) -> None:
    """Makes the folder ``uri``. In a bucket, one folder marker object for ``uri`` itself: Cloud Storage has no
    folders, and TensorFlow's recursive makedirs walks up the path until something exists, which at the bucket's
    root means reading the bucket's metadata (``storage.buckets.get``), a permission the README's object roles do
    not grant. TensorFlow's own recursive calls (checkpoints, summaries) under ``uri`` then stop at the marker."""
    if not is_remote(uri):
        if uri:  # "": the current folder, the folder of a bare file name
            os.makedirs(uri, exist_ok=True)
        return
    if is_bucket(uri):
        return
    import tensorflow as tf

    with contextlib.suppress(tf.errors.AlreadyExistsError):
        gfile().mkdir(uri)


# what a storage error names: the permission Cloud Storage denied, and the object (TensorFlow's message names
# the object it was reading or writing, not the bucket whose metadata it asked for)
_DENIED_PERMISSION = re.compile(r"storage\.[a-zA-Z]+\.[a-zA-Z]+")
_URI = re.compile(r"gs://[^\s'\"]+")


class PermissionDenied(ServiceFailed):
    """Cloud Storage refused the account something: one line naming the URI and the permission."""


@contextlib.contextmanager
def permission_errors_in_one_line(values: Iterable[Any]) -> Iterator[None]:
    """Turns a storage permission error into ``PermissionDenied``, naming the URI it names or else the buckets of
    ``values`` (a job's arguments: URIs, artifacts with a ``uri``, lists of either)."""
    try:
        yield
    except Exception as error:
        denied = permission_denied(error, remote_uris(values))
        if not denied:
            raise
        raise PermissionDenied(denied) from None


def remote_uris(values: Iterable[Any]) -> list[str]:
    found = []
    for value in values:
        for item in value if isinstance(value, list) else [value]:
            uri = getattr(item, "uri", item)
            if isinstance(uri, str) and is_remote(uri):
                found.append(uri)
    return found


def permission_denied(error: BaseException, uris: Iterable[str] = ()) -> str:
    """One line for a storage permission error (TensorFlow's ``PermissionDeniedError`` from a bucket), naming the
    permission and the URI, else the buckets of ``uris`` (what the job was given); "" for any other error."""
    tf = sys.modules.get("tensorflow")
    if tf is None or not isinstance(error, tf.errors.PermissionDeniedError):
        return ""
    message = str(error)
    permission = _DENIED_PERMISSION.search(message)
    named = _URI.search(message)
    buckets = sorted({f"gs://{bucket_name(uri)}" for uri in uris if is_remote(uri)})
    where = named.group(0) if named else " or ".join(buckets) or "a bucket"
    lacking = permission.group(0) if permission else "a storage permission"
    return (
        f"permission denied on {where}: the account lacks {lacking} (the README's service account step lists the "
        "roles the steps need)"
    )


def remove(uri: str) -> None:
    if is_remote(uri):
        gfile().remove(uri)
    else:
        os.remove(uri)


def files_under(uri: str) -> list[tuple[str, int]]:
    """Every file under the folder ``uri``, at any depth, with its size in bytes, sorted; [] when there is none. In a
    bucket: one listing a folder and one metadata read an object (object permissions only). On this machine a
    symbolic link is a file and never followed: what it points to is not under ``uri``, so not its to delete."""
    if is_remote(uri):
        paths = sorted(join(folder, name) for folder, _, names in gfile().walk(uri) for name in names)
        return [(path, size(path)) for path in paths]
    if os.path.islink(uri):
        return [(uri, os.lstat(uri).st_size)]
    paths = []
    for folder, folders, names in os.walk(uri):  # os.walk lists a link to a folder but does not enter it
        links = [name for name in folders if os.path.islink(os.path.join(folder, name))]
        paths += [os.path.join(folder, name) for name in [*names, *links]]
    return [(path, os.lstat(path).st_size) for path in sorted(paths)]


def remove_folder(uri: str) -> None:
    """Deletes the folder ``uri`` once its files are deleted, and nothing else: its empty folders, bottom up (in a
    bucket their folder markers: a bucket has no folders, a prefix is gone with its last object). A file written
    under ``uri`` meanwhile stays, with the folders that hold it: what was not listed is not deleted."""
    if not is_remote(uri):
        for folder, _, _ in os.walk(uri, topdown=False):
            if not os.listdir(folder):
                os.rmdir(folder)
        return
    errors = gfile_errors()
    for folder, _, _ in gfile().walk(uri, topdown=False):
        # a prefix without a marker is gone with its last object: a parent whose only content was its children's
        # markers no longer lists, and a marker may be gone already
        with contextlib.suppress(errors.NotFoundError):
            if not gfile().listdir(folder):
                gfile().remove(folder.rstrip("/") + "/")


def gfile_errors() -> Any:
    """TensorFlow's storage errors (``tf.errors``), imported on first use as ``gfile`` is."""
    import tensorflow as tf

    return tf.errors


def open_file(uri: str, mode: str = "rb") -> Any:
    if is_remote(uri):
        return gfile().GFile(uri, mode)
    return open(uri, mode, **({} if "b" in mode else {"encoding": "utf-8"}))


class _RandomAccessFile(io.RawIOBase):
    """A file in storage as a standard binary file, for readers (pyarrow, decompressors) that need the full ``io``
    interface (a ``GFile`` has only part of it). ``bytes_read`` counts the bytes read from storage."""

    def __init__(self, uri: str):
        self._file = open_file(uri, "rb")
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        data = self._file.read(len(buffer))
        buffer[: len(data)] = data
        self.bytes_read += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._file.seek(offset, whence)
        return self._file.tell()

    def tell(self) -> int:
        return self._file.tell()

    def close(self) -> None:
        self._file.close()
        super().close()


def open_random_access(uri: str) -> io.BufferedReader:
    return io.BufferedReader(_RandomAccessFile(uri), buffer_size=1 << 20)


def suffix(name: str) -> str:
    """The last suffix of a file name, lowercased (".gz" of "a.TXT.GZ"), or ""."""
    return "." + name.rsplit(".", 1)[-1].lower() if "." in name else ""


def compression(uri: str) -> str:
    """The compression suffix of ``uri`` (".gz", ".zst", ".bz2", ".xz"), or ""."""
    last = suffix(basename(uri))
    return last if last in DECOMPRESSORS else ""


class DecompressedFile(io.BufferedReader):
    """The decompressed bytes of a compressed file, streamed; ``compressed_bytes_read`` counts the bytes read
    from storage (the decompressor reads ahead, so it runs a little ahead of what was returned)."""

    def __init__(self, uri: str):
        self._raw_file = _RandomAccessFile(uri)
        suffix = compression(uri)
        opened = DECOMPRESSORS[suffix](self._raw_file, "rb", **READ_OPTIONS.get(suffix, {}))
        super().__init__(opened, buffer_size=1 << 16)

    @property
    def compressed_bytes_read(self) -> int:
        return self._raw_file.bytes_read

    def close(self) -> None:
        super().close()
        self._raw_file.close()


def read_bytes(uri: str) -> bytes:
    with open_file(uri, "rb") as f:
        return f.read()


def read_text(uri: str) -> str:
    return read_bytes(uri).decode("utf-8")


def temp_name(uri: str) -> str:
    """A name beside ``uri`` that no reader's ``*.json``/``*.tfrecord`` pattern matches."""
    return f"{uri}.{uuid.uuid4().hex[:12]}{TEMP_SUFFIX}"


def remove_temporaries(uri: str) -> None:
    """Deletes the temporary files interrupted writers left: those of the file ``uri`` (which itself stays), or
    of every file in ``uri`` when it is a folder."""
    pattern = join(uri, "*") if isdir(uri) else f"{uri}.*"
    for temp in glob(pattern + TEMP_SUFFIX):
        remove(temp)


def publish(temp_uri: str, final_uri: str) -> None:
    """Makes a completely written file visible under its final name."""
    if is_remote(temp_uri) or is_remote(final_uri):
        gfile().rename(temp_uri, final_uri, overwrite=True)
    else:
        os.replace(temp_uri, final_uri)


def copy(source: str, destination: str) -> None:
    """Copies a file, published under its final name only when complete."""
    makedirs(dirname(destination))
    temp = temp_name(destination)
    if is_remote(source) or is_remote(destination):
        gfile().copy(source, temp, overwrite=True)
    else:
        shutil.copyfile(source, temp)
    publish(temp, destination)


def write_bytes_atomic(uri: str, data: bytes) -> None:
    makedirs(dirname(uri))
    temp = temp_name(uri)
    with open_file(temp, "wb") as f:
        f.write(data)
    publish(temp, uri)


def write_text_atomic(uri: str, text: str) -> None:
    write_bytes_atomic(uri, text.encode("utf-8"))


def upload_folder(local_dir: Path, uri: str, last: Iterable[str] = ()) -> None:
    """Copies the files of ``local_dir`` into ``uri``, each published atomically, the names in ``last`` at
    the end: readers that wait for those files never see the folder half-copied."""
    makedirs(uri)
    last = list(last)
    files = sorted(p for p in local_dir.iterdir() if p.is_file())
    files.sort(key=lambda p: p.name in last)
    for path in files:
        write_bytes_atomic(join(uri, path.name), path.read_bytes())


def download_folder(uri: str, local_dir: Path) -> Path:
    """Copies the files of the folder ``uri`` (not recursive) into ``local_dir``."""
    local_dir.mkdir(parents=True, exist_ok=True)
    for name in listdir(uri):
        if not name.endswith(TEMP_SUFFIX) and not isdir(join(uri, name)):
            (local_dir / name).write_bytes(read_bytes(join(uri, name)))
    return local_dir
