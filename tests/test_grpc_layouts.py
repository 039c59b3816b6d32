"""Repeated ModelInferRequest layouts: a kept layout must mean exactly what protobuf would parse."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from analyzer.config.model_config import parse_model_config
from analyzer.worker.errors import InferError
from analyzer.worker.grpc import InferenceService
from analyzer.worker.grpc_calls import _Context
from analyzer.worker.grpc_layouts import Layouts, raw_start
from analyzer.worker.grpc_messages import MalformedRequest
from analyzer.worker.validate import RequestValidator

CONFIG = """
name: "m"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] },
        { name: "B" data_type: TYPE_INT64 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def message(a: np.ndarray, b: np.ndarray, **fields) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m", **fields)
    for name, array, wire in (("A", a, "FP32"), ("B", b, "INT64")):
        request.inputs.add(name=name, datatype=wire, shape=list(array.shape))
        request.raw_input_contents.append(array.tobytes())
    request.outputs.add(name="Y")
    request.parameters["priority"].uint64_param = 2
    return request


class Model:
    name, version = "m", 1

    def __init__(self, config: str = CONFIG) -> None:
        self.validator = RequestValidator(parse_model_config(config))
        self.submitted: list = []

    def submit(self, request, checked: bool = False) -> None:
        if not checked:
            self.validator.check(request)
        self.submitted.append(request)


class Manager:
    def __init__(self) -> None:
        self.model = Model()
        self.ready = True

    def all_ready(self) -> bool:
        return self.ready

    def get(self, name: str, version: str = "") -> Model:
        if name != "m":
            raise InferError(f"Request for unknown model: '{name}' is not found")
        return self.model


@pytest.fixture
def service() -> InferenceService:
    return InferenceService(Manager(), api=None)


def values(rng, batch: int = 1, width: int = 3):
    return (rng.standard_normal((batch, 4)).astype(np.float32),
            rng.integers(-9, 9, (batch, width)).astype(np.int64))  # fmt: skip


def test_raw_start_finds_the_first_raw_field_or_refuses():
    rng = np.random.default_rng(0)
    data = message(*values(rng)).SerializeToString()
    start = raw_start(data)
    assert start > 0 and data[start] == 0x3A
    assert pb.ModelInferRequest.FromString(data[:start]).raw_input_contents == []
    assert raw_start(pb.ModelInferRequest(model_name="m").SerializeToString()) == -1
    assert raw_start(data + b"\x40\x01") == start  # what follows is the layout's to check
    assert raw_start(b"\x0a\x05ab") == -1  # ends inside a field
    assert raw_start(b"\x08\x01" + data) == -1  # a varint field: not ModelInferRequest's
    assert raw_start(b"\x0a" + b"\xff" * 6) == -1  # a runaway length


def test_a_repeated_layout_is_served_from_its_kept_parse(service):
    rng = np.random.default_rng(1)
    model = service.manager.model
    first = values(rng)
    service.submit_bytes(message(*first, id="x").SerializeToString(), None)
    assert len(service.layouts.layouts) == 1
    # a streaming client numbers its requests: the id is not part of the layout
    for request_id in ("x", "y", "", "a much longer id than the first one, 12345"):
        a, b = values(rng)
        got_model, fields, requested, request = service.submit_bytes(
            message(a, b, id=request_id).SerializeToString(), None)  # fmt: skip
        assert service.layouts.last is not None and got_model is model
        assert requested == ("Y",) and fields.id == "" and not fields.raw_input_contents
        np.testing.assert_array_equal(request.inputs["A"], a)
        np.testing.assert_array_equal(request.inputs["B"], b)
        assert request.wire_types == {"A": "FP32", "B": "INT64"}
        assert request.priority == 2 and request.id == request_id and request.batch_size == 1
    assert len(model.submitted) == 5 and len(service.layouts.layouts) == 1


def test_answers_share_one_head_and_carry_their_own_id(service):
    """The response head is kept per layout, not per id; each answer appends its id."""
    model = service.manager.model
    for request_id in ("1", "22", ""):
        outputs = {"Y": np.full((1, 4), float(len(request_id)), np.float32)}
        fields = pb.ModelInferRequest(model_name="m")
        fields.outputs.add(name="Y")
        data = b"".join(service.encode_parts(model, fields, outputs, ("Y",), request_id))
        answer = pb.ModelInferResponse.FromString(data)
        assert answer.id == request_id and answer.model_name == "m"
        assert [o.name for o in answer.outputs] == ["Y"] and list(answer.outputs[0].shape) == [1, 4]
        y = np.frombuffer(answer.raw_output_contents[0], np.float32)
        assert y.tolist() == [float(len(request_id))] * 4
    assert len(service._heads) == 1


def test_other_sizes_fields_or_trailing_bytes_take_the_general_path(service):
    rng = np.random.default_rng(2)
    service.submit_bytes(message(*values(rng)).SerializeToString(), None)
    layouts = service.layouts
    assert layouts.match(message(*values(rng)).SerializeToString()) is not None
    assert layouts.match(message(*values(rng, width=5)).SerializeToString()) is None
    assert layouts.match(message(*values(rng, batch=2)).SerializeToString()) is None
    matched = layouts.match(message(*values(rng), id="other").SerializeToString())
    assert matched is not None and matched[2] == "other"  # only the id differs
    twice = message(*values(rng), id="a").SerializeToString()
    start = raw_start(twice)
    assert layouts.match(twice[:start] + b"\x1a\x01b" + twice[start:]) is None  # two ids
    assert layouts.match(twice.replace(b"\x1a\x01a", b"\x1a\x01\xff")) is None  # not UTF-8
    data = message(*values(rng)).SerializeToString()
    assert layouts.match(data + b"\x0a\x01m") is None  # a field after the raw contents
    start = raw_start(data)
    swapped = bytearray(data)  # the same length, but the two raw fields cut differently
    swapped[start + 1] += 4
    assert layouts.match(bytes(swapped)) is None
    # a general-path request with a new width is accepted and teaches its own layout
    _, _, _, request = service.submit_bytes(
        message(*values(rng, width=5)).SerializeToString(), None)  # fmt: skip
    assert request.inputs["B"].shape == (1, 5) and len(layouts.layouts) == 2


def test_a_kept_layout_is_still_checked_against_a_new_model_version(service):
    rng = np.random.default_rng(3)
    data = message(*values(rng)).SerializeToString()
    service.submit_bytes(data, None)
    service.submit_bytes(data, None)
    service.manager.model = Model(CONFIG.replace("dims: [ -1 ]", "dims: [ 7 ]"))  # reloaded
    with pytest.raises(InferError, match="unexpected shape for input 'B'"):
        service.submit_bytes(data, None)
    assert service.manager.model.submitted == []


def test_bytes_inputs_typed_contents_and_bad_requests_are_never_kept(service):
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="A", datatype="FP32", shape=[1, 4]).contents.fp32_contents.extend(
        [1, 2, 3, 4])  # fmt: skip
    request.inputs.add(name="B", datatype="INT64", shape=[1, 1]).contents.int64_contents.append(5)
    _, _, _, got = service.submit_bytes(request.SerializeToString(), None)
    assert got.inputs["B"].tolist() == [[5]] and not service.layouts.layouts
    bad = message(np.zeros((1, 3), np.float32), np.zeros((1, 2), np.int64))
    with pytest.raises(InferError, match="unexpected shape for input 'A'"):
        service.submit_bytes(bad.SerializeToString(), None)
    with pytest.raises(InferError, match="malformed request"):
        service.submit_bytes(b"\x0a\xff", None)
    assert not service.layouts.layouts


def test_layouts_are_bounded(service):
    rng = np.random.default_rng(4)
    for i in range(Layouts.MAX_LAYOUTS + 10):
        request = message(*values(rng))
        request.parameters["layout"].int64_param = i  # another parameter: another layout
        service.submit_bytes(request.SerializeToString(), None)
    assert len(service.layouts.layouts) == Layouts.MAX_LAYOUTS
    long_id = "i" * (Layouts.MAX_PREFIX_BYTES + 1)
    before = dict(service.layouts.layouts)
    service.submit_bytes(message(*values(rng), id=long_id).SerializeToString(), None)
    assert service.layouts.layouts == before


def _outcome(service: InferenceService, data: bytes):
    """What the service makes of `data`: the error's class, or the request it queued and the
    output names its answer will carry."""
    try:
        _, fields, requested, request = service.submit_bytes(data, None)
    except InferError as err:
        return ("refused", isinstance(err, MalformedRequest))
    names = list(requested) if requested is not None else [o.name for o in fields.outputs]
    inputs = {n: (a.dtype.str, a.shape, a.tobytes()) for n, a in request.inputs.items()}
    return ("queued", request.model_name, inputs, request.wire_types, request.requested_outputs,
            request.id, request.parameters, request.priority, request.timeout_us,
            request.correlation_id, request.flags, request.batch_size, names)  # fmt: skip


def test_mutated_messages_mean_on_the_short_path_what_protobuf_parses(service):
    """A differential fuzz of the kept layouts: 3,000 byte-level mutations of messages whose
    layouts are kept, each queued by the worker's service and, for reference, by a fresh service
    that knows no layout (protobuf's parse). Both must refuse it, or queue the same request."""
    rng = np.random.default_rng(5)
    mutator = random.Random(5)
    bases = []
    for width, request_id, extra in ((3, "", False), (3, "abc", True), (5, "q" * 20, False)):
        request = message(*values(rng, width=width), id=request_id)
        if extra:
            request.parameters["timeout"].int64_param = 5_000_000
            request.parameters["sequence_id"].uint64_param = 7
        bases.append(request.SerializeToString())
    for base in bases:  # learned: from now on these layouts take the short path
        service.submit_bytes(base, None)
    assert len(service.layouts.layouts) == len(bases)
    differ, short = [], 0
    for case in range(3000):
        data = bytearray(mutator.choice(bases))
        start = raw_start(bytes(data))
        what = mutator.randrange(6)
        if what == 0:  # new tensor contents, same length: must be read from these bytes
            i = start
            while i < len(data):  # each raw field: its tag, a one-byte length, the tensor
                n = data[i + 1]
                for j in range(i + 2, i + 2 + n):
                    if mutator.random() < 0.3:
                        data[j] = mutator.randrange(256)
                i += 2 + n
        elif what == 1:  # bytes flipped anywhere
            for _ in range(mutator.randrange(1, 4)):
                data[mutator.randrange(len(data))] = mutator.randrange(256)
        elif what == 2:  # bytes flipped in the layout's head
            for _ in range(mutator.randrange(1, 3)):
                data[mutator.randrange(start)] = mutator.randrange(256)
        elif what == 3:  # cut short
            data = data[: mutator.randrange(len(data))]
        elif what == 4:  # bytes appended: another field, or garbage
            data += mutator.choice([b"\x1a\x01z", b"\x0a\x01m", b"\x40\x01", mutator.randbytes(5)])
        else:  # a byte inserted or removed in the head (every length after it shifts)
            at = mutator.randrange(start)
            data[at:at] = bytes([mutator.randrange(256)]) if mutator.random() < 0.5 else b""
            if data == bytearray(mutator.choice(bases)):
                del data[at]
        data = bytes(data)
        short += service.layouts.match(data) is not None
        expected = _outcome(InferenceService(Manager(), api=None), data)
        got = _outcome(service, data)
        if got != expected:
            differ.append((case, data.hex(), expected[:2], got[:2]))
    assert not differ, differ[:3]
    assert short > 600, short  # a quarter of the cases took the short path


def test_cached_response_heads_answer_as_protobuf_would(service):
    """A differential fuzz of the response-head cache: 2,000 answers with random output names,
    types, shapes (empty ones, non-contiguous views), requested subsets and ids, each encoded
    by `encode_parts` (a head kept per layout, then id and raw bytes appended) and by building
    the ModelInferResponse in full. Both must parse to the same message, or both refuse."""
    model = service.manager.model
    rng = np.random.default_rng(6)
    mutator = random.Random(6)
    kinds = [np.float32, np.float16, np.float64, np.int8, np.uint8, np.int32, np.int64,
             np.uint64, np.bool_]  # fmt: skip
    layouts = []
    for _ in range(12):  # a few layouts, so that heads repeat and are reused
        names = mutator.sample(["Y", "Z", "OUT__0", "scores"], mutator.randrange(1, 4))
        shapes = {n: tuple(mutator.choice([0, 1, 2, 3, 7]) for _ in range(mutator.randrange(4)))
                  for n in names}  # fmt: skip
        dtypes = {n: mutator.choice(kinds) for n in names}
        layouts.append((names, shapes, dtypes))
    checked = 0
    for case in range(2000):
        names, shapes, dtypes = mutator.choice(layouts)
        outputs = {}
        for n in names:
            array = (rng.standard_normal(shapes[n]) * 50).astype(dtypes[n])
            if array.ndim >= 2 and mutator.random() < 0.3:
                array = array.T  # a transposed view: Fortran order, not C
            outputs[n] = array
        requested = tuple(mutator.sample(names, mutator.randrange(len(names) + 1)))
        if mutator.random() < 0.1:
            requested += ("missing",)  # a requested output the model did not produce
        request_id = mutator.choice(["", "7", "req-" * mutator.randrange(1, 30), "é✓"])
        fields = pb.ModelInferRequest(model_name="m", id=request_id)
        for n in requested:
            fields.outputs.add(name=n)
        try:
            expected = service.encode(model, request_id, outputs, list(requested) or None)
        except InferError:
            with pytest.raises(InferError):
                service.encode_parts(model, fields, outputs, requested or None, request_id)
            continue
        parts = service.encode_parts(model, fields, outputs,
                                     requested if mutator.random() < 0.5 else None,
                                     request_id)  # fmt: skip
        got = pb.ModelInferResponse.FromString(b"".join(parts))
        assert got == expected, (case, got, expected)
        checked += 1
    assert checked > 1500 and 0 < len(service._heads) < checked / 4  # heads were reused


def test_without_a_rest_api_health_is_answered_from_the_manager(service):
    """In-process services (tests, benchmarks) have no REST API beside them: live, and ready as
    the manager says, instead of failing the call."""
    context = _Context(())
    live = asyncio.run(service.ServerLive(pb.ServerLiveRequest(), context))
    ready = asyncio.run(service.ServerReady(pb.ServerReadyRequest(), context))
    service.manager.ready = False
    not_ready = asyncio.run(service.ServerReady(pb.ServerReadyRequest(), context))
    assert live.live and ready.ready and not not_ready.ready
