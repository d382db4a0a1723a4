"""The few file operations the archive's commit protocol needs, on any Hadoop URI.

Through the session's own Hadoop FileSystem (py4j), so that file://, hdfs:// and s3a://
behave as Spark's writers see them. Paths are strings: URIs, or absolute local paths
(which mean file://).
"""

from __future__ import annotations

import json
from typing import Any


def to_uri(location: str) -> str:
    """A URI for a location: absolute local paths become file:// URIs."""
    if "://" in location:
        return location.rstrip("/")
    import os

    return "file://" + os.path.abspath(os.path.expanduser(location)).rstrip("/")


class HadoopFS:
    def __init__(self, spark: Any, uri: str) -> None:
        jvm = spark.sparkContext._jvm
        self._jvm = jvm
        self._Path = jvm.org.apache.hadoop.fs.Path
        self._fs = self._Path(uri).getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())

    def _p(self, path: str) -> Any:
        return self._Path(path)

    def exists(self, path: str) -> bool:
        return bool(self._fs.exists(self._p(path)))

    def mkdirs(self, path: str) -> None:
        self._fs.mkdirs(self._p(path))

    def delete(self, path: str) -> None:
        self._fs.delete(self._p(path), True)

    def rename(self, src: str, dst: str) -> bool:
        return bool(self._fs.rename(self._p(src), self._p(dst)))

    def list_dir(self, path: str) -> list[tuple[str, bool]]:
        """(name, is_dir) of the entries of a directory; [] when it does not exist.
        Hidden checksum files (``.name.crc``, written by Hadoop's local FS) are left out."""
        if not self.exists(path):
            return []
        return [
            (s.getPath().getName(), bool(s.isDirectory()))
            for s in self._fs.listStatus(self._p(path))
            if not s.getPath().getName().startswith(".")
        ]

    def list_files(self, path: str) -> list[str]:
        """Paths, relative to ``path``, of every data file below it (recursive), leaving
        out Spark's markers (``_SUCCESS``) and hidden files."""
        base = self._fs.makeQualified(self._p(path)).toString().rstrip("/") + "/"
        found = []
        files = self._fs.listFiles(self._p(path), True)
        while files.hasNext():
            full = files.next().getPath()
            name = full.getName()
            if name.startswith(("_", ".")):
                continue
            found.append(self._fs.makeQualified(full).toString()[len(base) :])
        return sorted(found)

    def read_text(self, path: str) -> str:
        stream = self._fs.open(self._p(path))
        try:
            return bytes(self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream)).decode()
        finally:
            stream.close()

    def write_text(self, path: str, text: str) -> None:
        """Replace a small file as atomically as the filesystem allows: write a sibling,
        then rename it over (delete + rename where rename does not replace)."""
        tmp = path + ".tmp"
        out = self._fs.create(self._p(tmp), True)
        try:
            out.write(bytearray(text.encode()))
        finally:
            out.close()
        if self.exists(path):
            self.delete(path)
        if not self.rename(tmp, path):
            raise OSError(f"could not rename {tmp} to {path}")

    def read_json(self, path: str) -> Any | None:
        """A JSON file written by `write_json`; None when absent. A crash inside
        `write_text` between its delete and its rename leaves only the ``.tmp``: read it."""
        for candidate in (path, path + ".tmp"):
            if self.exists(candidate):
                try:
                    return json.loads(self.read_text(candidate))
                except ValueError:
                    continue  # a torn .tmp: the write it belonged to never finished
        return None

    def write_json(self, path: str, data: Any) -> None:
        self.write_text(path, json.dumps(data, indent=1, sort_keys=True))
