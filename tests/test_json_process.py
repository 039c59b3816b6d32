"""A large REST request's JSON parsed in a child process gives what json.loads gives in-process:
the same values, lists rebuilt from slices in order, and the same error for bad JSON."""

from __future__ import annotations

import http.client
import json

import numpy as np
import pytest
from serving import python_models, start_worker

from analyzer.worker import json_child, json_process
from analyzer.worker.errors import InferError
from analyzer.worker.params import _parse_json

SLICE = json_child.SLICE


def _documents() -> list[dict]:
    rng = np.random.default_rng(7)
    floats = rng.standard_normal(3 * SLICE + 5).tolist()
    return [
        {"id": "small", "inputs": [{"name": "X", "shape": [2], "datatype": "FP32",
                                    "data": [1.5, -2]}]},
        {"inputs": [{"name": "X", "datatype": "FP32", "shape": [len(floats)], "data": floats},
                    {"name": "S", "datatype": "BYTES", "shape": [SLICE + 1],
                     "data": [f"wörd {i} ✓" for i in range(SLICE + 1)]}],
         "parameters": {"big": list(range(2 * SLICE)), "huge": 10**30, "neg": -(2**63) - 1}},
        # rows: a list whose values are in its rows; rows of every size, one longer than a slice
        {"inputs": [{"name": "M", "data": [[float(i)] * 1000 for i in range(300)]},
                    {"name": "R", "data": [[1, 2], list(range(SLICE + 3)), [], [[True, None]]]},
                    {"name": "E", "data": [[] for _ in range(SLICE + 2)]}]},
        # a long list inside a long list, and mixed values
        {"a": [{"b": list(range(SLICE + 1))}] * 2 + [0.5, "x", None, False] * SLICE,
         "nan": float("nan"), "inf": [float("inf"), -float("inf")]},
    ]  # fmt: skip


@pytest.mark.parametrize("index", range(4))
def test_the_child_gives_what_json_loads_gives(index):
    body = json.dumps(_documents()[index]).encode()
    got = json_process.parse_in_child(body)
    want = json.loads(body)
    # NaN is not equal to itself: compare the JSON they make (json.dumps writes NaN as NaN)
    assert json.dumps(got) == json.dumps(want)
    if index == 2:
        assert got["inputs"][0]["data"][299] == [299.0] * 1000  # rows in order


def test_split_and_join_undo_each_other_where_the_markers_are():
    document = json.loads(json.dumps(_documents()[3]))
    skeleton, lists = json_child.split(json.loads(json.dumps(document)))
    # children first: the two inner long lists are cut, then the outer list, whose first run
    # holds their markers
    assert len(lists) == 3 and skeleton["a"] == (2,) and not lists[0][0] and not lists[1][0]
    outer_is_dict, outer_runs = lists[2]
    assert not outer_is_dict and len(outer_runs) > 4
    assert outer_runs[0][1] and not any(marked for _, marked in outer_runs[1:])
    assert json.dumps(json_process.join(skeleton, lists)) == json.dumps(document)


@pytest.mark.parametrize("body", [
    b'{"inputs": [1, 2,]}', b"[1, 2, 3]", b'"text"', b"{" + b'"a": 1' * 3, b"\xff\xfe{}",
    b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", b'{"n": 1' + b"0" * 5000 + b"}", b"",
])  # fmt: skip
def test_bad_json_gets_the_same_error_as_in_process(body):
    with pytest.raises(InferError) as inline:
        _parse_json(body)
    with pytest.raises(InferError) as child:
        json_process.parse_in_child(body)
    assert str(child.value) == str(inline.value)
    assert child.value.status == inline.value.status


ECHO = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 2)]) for r in requests]
"""
CONFIG = ('max_batch_size: 0 input [ { name: "X" data_type: TYPE_FP64 dims: [ -1 ] } ] '
          'output [ { name: "Y" data_type: TYPE_FP64 dims: [ -1 ] } ]')  # fmt: skip


def test_a_request_over_the_child_threshold_is_answered_as_a_small_one_is(tmp_path):
    python_models(tmp_path, {"double": ECHO}, CONFIG)
    served = start_worker(tmp_path)
    values = np.random.default_rng(3).standard_normal(300_000)
    conn = http.client.HTTPConnection(served.http, timeout=120)
    try:
        for data, big in ((values[:4], False), (values, True)):
            body = json.dumps({"id": "x", "inputs": [{
                "name": "X", "datatype": "FP64", "shape": [data.size],
                "data": data.tolist()}]}).encode()  # fmt: skip
            assert (len(body) >= json_process.PROCESS_JSON_BYTES) == big
            conn.request("POST", "/v2/models/double/infer", body)
            response = conn.getresponse()
            answer = json.loads(response.read())
            assert response.status == 200, answer
            assert answer["id"] == "x"
            assert answer["outputs"][0]["data"] == (data * 2).tolist()  # exact: FP64 both ways
        conn.request("POST", "/v2/models/double/infer", body[:-2])  # the big one, cut short
        response = conn.getresponse()
        error = json.loads(response.read())["error"]
        assert response.status == 400 and error.startswith("malformed JSON in request body")
        conn.request("POST", "/v2/models/double/infer", b"[" + body + b"]")  # not an object
        response = conn.getresponse()
        assert response.status == 400
        assert json.loads(response.read())["error"] == "request body must be a JSON object"
    finally:
        conn.close()
        served.stop()


def _values(value) -> int:
    """Values and containers in `value`, each counted once (what one pickle.loads makes)."""
    count, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, bytes):  # a run of a (document, runs) pickle: loaded later
            continue
        count += 1
        if isinstance(item, dict):
            stack.extend(item.values())
            count += len(item)  # the keys
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return count


@pytest.mark.parametrize("document", [
    {"inputs": [{"name": "F", "datatype": "FP32", "shape": [1], "data": [[]] * (4 * SLICE)}]},
    {"inputs": [{"name": "F", "data": [{}] * (4 * SLICE)}]},
    {"parameters": {f"k{i}": i for i in range(3 * SLICE)}},
    {f"k{i}": [i] for i in range(2 * SLICE)},
    {"a": [0] * SLICE + [list(range(3 * SLICE)), [[0]] * (3 * SLICE)]},
], ids=["empty-lists", "empty-objects", "wide-object", "wide-root", "scalar-first"])  # fmt: skip
def test_the_worker_rebuilds_every_container_a_slice_at_a_time(document, monkeypatch):
    """Each pickle.loads in the worker makes about SLICE values at most, whatever holds them:
    a list of millions of empty lists (which counted 0 and travelled as one slice: 5.4 s of
    held GIL for a 14 MiB body), a wide object, a list whose first item is a number."""
    loads, made = json_process.pickle.loads, []

    def measured(data):
        value = loads(data)
        made.append(_values(value))
        return value

    body = json.dumps(document).encode()
    monkeypatch.setattr(json_process.pickle, "loads", measured)
    got = json_process.parse_in_child(body)
    assert json.dumps(got) == json.dumps(document)
    assert max(made) <= 2 * SLICE + 8, sorted(made)[-3:]

