"""The checkpoint: every measured point (and every failed config) appended the moment it is known.

One JSON object per line, flushed and fsynced, so a crash or SIGKILL loses at most the point that
was being measured; a torn last line is ignored on reading. A rerun looks points up by key (the
variant's config content + the load + the measurement settings) and measures only what is missing.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from analyzer.errors import AnalyzerError
from analyzer.results.measurement import Measurement

FILE_NAME = "profile.ckpt.jsonl"
# the entry kinds that hold a measurement, all read back on a rerun
MEASURED = ("point", "calibration", "final_round", "load_check")


def point_key(config_text: str, load: str, value: int, batch_size: int, settings: str) -> str:
    blob = json.dumps([config_text, load, value, batch_size, settings])
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def config_key(config_text: str, settings: str) -> str:
    return hashlib.sha256(json.dumps([config_text, settings]).encode()).hexdigest()[:32]


class CheckpointError(AnalyzerError):
    """The checkpoint cannot be resumed from; the message names the file (and line)."""


class Checkpoint:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / FILE_NAME
        self.points: dict[str, Measurement] = {}
        self.failures: dict[str, str] = {}
        self.meta: dict[str, Any] = {}
        self.resumed = False
        if self.path.exists():
            self._read()

    def _read(self) -> None:
        if not self.path.is_file():
            raise CheckpointError(f"checkpoint '{self.path}' is not a file; move it away to "
                                  "start the run afresh")  # fmt: skip
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):  # torn by a crash: drop it so appends stay lines
            keep = data.rfind(b"\n") + 1
            with self.path.open("r+b") as f:
                f.truncate(keep)
            data = data[:keep]
        for number, line in enumerate(data.decode(errors="replace").splitlines(), 1):
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a line torn by a crash mid-write
            try:
                kind = entry.get("type")
                if kind in MEASURED:
                    self.points[str(entry["key"])] = Measurement.from_dict(entry["measurement"])
                elif kind == "failure":
                    self.failures[str(entry["key"])] = str(entry["error"])
                elif kind == "meta":
                    self.meta.update(entry["meta"])
            except (AttributeError, KeyError, TypeError, ValueError):  # not a record of ours
                raise CheckpointError(
                    f"checkpoint '{self.path}', line {number}: is not a checkpoint record; "
                    "move the file away to start the run afresh"
                ) from None
        self.resumed = bool(self.points or self.failures)

    def _append(self, entry: dict[str, Any]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        data = (json.dumps(entry) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    def record_meta(self, **meta: Any) -> None:
        self.meta.update(meta)
        self._append({"type": "meta", "meta": meta})

    def record_point(self, key: str, measurement: Measurement, kind: str = "point") -> None:
        """`kind`: one of MEASURED (a search point, a calibration window, a round of the final
        comparison, a load check of its first round)."""
        self.points[key] = measurement
        self._append({"type": kind, "key": key, "measurement": measurement.to_dict()})

    def record_failure(self, key: str, error: str) -> None:
        self.failures[key] = error
        self._append({"type": "failure", "key": key, "error": error})
