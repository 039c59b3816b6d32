"""A large REST request's JSON parsed in a process of its own.

`json.loads` is one C call: on the offload thread it still held the GIL, and so the event loop,
~35-80 ms per MiB of numbers (64 MiB: seconds in which no client was answered, health checks
included). A body of PROCESS_JSON_BYTES or more is parsed by json_child.py in a short-lived
child process instead and comes back as pickled slices, rebuilt here a slice at a time: each a
short C call, between which the loop gets the GIL. One child per request, started by the one
offload thread: no pool to keep alive, and what the parse made leaves with the child.

Same answers as in-process parsing: the child runs json.loads on the same bytes, and a pickle
gives back the same values. A child that fails (killed, out of memory) answers the request with
an error, not the worker's end.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, BinaryIO

from analyzer.worker.errors import InferError, Status

# as offload.OFFLOAD_JSON_BYTES: every JSON body the offload thread takes. Here a 1 MiB body of
# numbers was ~70 ms of json.loads in-process, ~160 ms in a child (its start, the pickles):
# the request waits longer, nobody else does
PROCESS_JSON_BYTES = 1 << 20
_CHILD = [sys.executable, "-I", "-S", str(Path(__file__).with_name("json_child.py"))]


def _scratch() -> BinaryIO:
    """An anonymous file in memory (a temporary file where memfd_create is missing)."""
    if hasattr(os, "memfd_create"):
        return os.fdopen(os.memfd_create("model-analyzer-json", os.MFD_CLOEXEC), "w+b")
    return tempfile.TemporaryFile()


def _run_child(body: bytes | bytearray | memoryview) -> tuple[int, bytes, bytes]:
    """(exit code, stdout, stderr) of json_child.py over `body`. The bytes go both ways through
    files, each in one system call: through pipes they went 32 KiB per call, and each call
    gives up the GIL and waits up to 5 ms to get it back while the event loop is busy."""
    with _scratch() as source, _scratch() as sink:
        source.write(body)
        source.seek(0)
        done = subprocess.run(_CHILD, stdin=source, stdout=sink, stderr=subprocess.PIPE,
                              check=False)  # fmt: skip
        size = os.fstat(sink.fileno()).st_size
        pieces, at = [], 0
        while at < size:  # one read, unless it is over the kernel's 2 GiB per call
            piece = os.pread(sink.fileno(), size - at, at)
            if not piece:
                break
            pieces.append(piece)
            at += len(piece)
    return done.returncode, pieces[0] if len(pieces) == 1 else b"".join(pieces), done.stderr


def parse_in_child(body: bytes | bytearray | memoryview) -> dict[str, Any]:
    """The JSON object `body` holds; InferError as _parse_json raises it for bad JSON."""
    try:
        code, out, err = _run_child(body)
    except OSError as error:
        raise InferError(f"cannot parse the request's JSON: no parser process: {error}",
                         Status.INTERNAL) from None  # fmt: skip
    if code != 0 or not out:
        why = err.decode(errors="replace").strip().splitlines()[-1:] or [f"exit code {code}"]
        raise InferError(f"cannot parse the request's JSON: its parser process failed: "
                         f"{why[0][:200]}", Status.INTERNAL)  # fmt: skip
    kind, payload = out[:1], memoryview(out)[1:]
    if kind == b"E":
        raise InferError(f"malformed JSON in request body: {bytes(payload).decode()}")
    if kind == b"N":
        raise InferError("request body must be a JSON object")
    document, cut = pickle.loads(payload)
    return join(document, cut)


def join(document: Any, cut: list[tuple[bool, list[tuple[bytes, bool]]]]) -> dict[str, Any]:
    """json_child.split undone: each `(index,)` marker becomes its list or object again, a
    slice at a time (each slice's pickle.loads a short C call). The child cut children
    first, so the markers inside a cut container name earlier ones: rebuilt in order, no
    recursion however deep they nest."""
    built: list[Any] = []
    for is_dict, runs in cut:
        whole: Any = {} if is_dict else []
        for run, marked in runs:
            part = pickle.loads(run)
            if marked:
                _fill(part, built)
            if is_dict:
                whole.update(part)
            else:
                whole.extend(part)
        built.append(whole)
    root = [document]
    if built:
        _fill(root, built)
    result: dict[str, Any] = root[0]
    return result


def _fill(node: list[Any] | dict[str, Any], built: list[Any]) -> None:
    """The markers inside `node` (a part json_child left whole: small) replaced by what they
    stand for."""
    stack = [node]
    while stack:
        part = stack.pop()
        items = part.items() if isinstance(part, dict) else enumerate(part)
        for key, value in items:
            if type(value) is tuple:
                part[key] = built[value[0]]  # type: ignore[index]
            elif isinstance(value, dict | list) and value:
                stack.append(value)
