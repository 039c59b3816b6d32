"""Python-backend models written for Triton, served by a real worker process."""

from __future__ import annotations

import json
import signal

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from serving import python_models, start_worker
from tritonclient.utils import InferenceServerException

MODELS = {
    "strings": (
        """
name: "strings"
backend: "python"
max_batch_size: 4
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "REVERSED" data_type: TYPE_STRING dims: [ 1 ] } ]
""",
        """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            rev = np.array([[t[0][::-1]] for t in text], dtype=np.object_)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("REVERSED", rev)]))
        return out
""",
    ),
    "flaky": (
        """
name: "flaky"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
""",
        """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if x[0] < 0:
                raise ValueError("negative input is not allowed")
            if x[0] == 0:
                out.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("zero is rejected by the model")))
                continue
            if 100 <= x[0] <= 107:  # TritonError's codes 0-7
                out.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"code {x[0] - 100}", int(x[0]) - 100)))
                continue
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2)]))
        return out
""",
    ),
    "extra": (
        """
name: "extra"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "ASKED" data_type: TYPE_STRING dims: [ 1 ] } ]
""",
        """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            asked = ",".join(sorted(request.requested_output_names())).encode()  # a set
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", x * 2), pb_utils.Tensor("WRONG", x),
                pb_utils.Tensor("ASKED", np.array([asked], dtype=np.object_))]))
        return out
""",
    ),
    "auto": (
        'name: "auto"\nbackend: "python"\n',
        """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [2]})
        config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [2]})
        config.set_max_batch_size(4)
        config.set_dynamic_batching()
        return config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() * 10)]) for r in requests]
""",
    ),
    "partial": (
        # a config that gives part of the tensors and a smaller max_batch_size: Triton's
        # add_input/add_output fill the rest in, and the model may raise max_batch_size
        'name: "partial"\nbackend: "python"\nmax_batch_size: 2\n'
        'input [ { name: "IN" data_type: TYPE_FP32 } ]\noutput [ { name: "OUT" } ]\n',
        """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.set_max_batch_size(8)
        config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4]})
        config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]})
        for wrong, words in (
                (lambda: config.set_max_batch_size(1), "configuration specified max_batch_size 8"),
                (lambda: config.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [4]}),
                 "configuration expects datatype TYPE_FP32 for input 'IN'"),
                (lambda: config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [5]}),
                 "the model expects dims [5] but the model configuration specifies dims [4]"),
                (lambda: config.add_input({"name": "X", "data_type": "TYPE_FP32"}),
                 "is missing 'dims' property"),
                (lambda: config.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [1],
                                            "optional": True}), "contains property other"),
                (lambda: config.set_model_transaction_policy({"decoupled": True}) or
                         config.set_model_transaction_policy({"decoupled": False}),
                 "trying to change decoupled property")):
            try:
                wrong()
            except ValueError as err:
                assert words in str(err), (words, str(err))
            else:
                raise AssertionError(f"no ValueError: {words}")
        config.as_dict()["model_transaction_policy"]["decoupled"] = False
        return config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() + 1)]) for r in requests]
""",
    ),
    "lifecycle": (
        """
name: "lifecycle"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "ARGS" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }
]
instance_group [ { count: 2 kind: KIND_CPU } ]
parameters { key: "marker" value: { string_value: "MARKER" } }
""",
        """
import json, os, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.args = args
        config = json.loads(args["model_config"])
        self.marker = config["parameters"]["marker"]["string_value"]

    def execute(self, requests):
        time.sleep(0.05)
        return [pb_utils.InferenceResponse([
            pb_utils.Tensor("ARGS", np.array([json.dumps(self.args).encode()], dtype=np.object_)),
            pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64)),
        ]) for _ in requests]

    def finalize(self):
        with open(self.marker, "a") as f:
            f.write(self.args["model_instance_name"] + "\\n")
""",
    ),
}


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    repo = tmp_path_factory.mktemp("pyrepo")
    marker = repo / "finalized.txt"
    for name, (config, code) in MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config.replace("MARKER", str(marker)))
        (repo / name / "1" / "model.py").write_text(code)
    served = start_worker(repo)
    served.marker = marker
    yield served
    served.stop()


def test_bytes_tensors_over_http_and_grpc(worker):
    text = np.array([[b"hello"], [b"triton"]], dtype=np.object_)
    for module, address in ((httpclient, worker.http), (grpcclient, worker.grpc)):
        client = module.InferenceServerClient(address)
        inp = module.InferInput("TEXT", [2, 1], "BYTES")
        inp.set_data_from_numpy(text)
        out = client.infer("strings", [inp]).as_numpy("REVERSED")
        assert out.tolist() == [[b"olleh"], [b"notirt"]]
        client.close()


def _flaky(client, value: int):
    inp = httpclient.InferInput("X", [1], "INT32")
    inp.set_data_from_numpy(np.array([value], np.int32))
    return client.infer("flaky", [inp])


def test_model_errors_reach_the_client_and_the_worker_keeps_serving(worker):
    client = httpclient.InferenceServerClient(worker.http)
    with pytest.raises(InferenceServerException, match="negative input is not allowed"):
        _flaky(client, -1)
    with pytest.raises(InferenceServerException, match="zero is rejected by the model"):
        _flaky(client, 0)
    assert _flaky(client, 21).as_numpy("Y").tolist() == [42]
    stats = client.get_inference_statistics("flaky")["model_stats"][0]["inference_stats"]
    assert stats["fail"]["count"] == 2 and stats["success"]["count"] == 1
    client.close()


def test_a_model_errors_code_is_the_clients_status(worker):
    """TritonError(message, code) reached every client as 500 / INTERNAL; Triton answers each
    code with its own HTTP status (HttpCodeFromError) and gRPC code."""
    import grpc

    expected = {0: (400, grpc.StatusCode.UNKNOWN), 1: (500, grpc.StatusCode.INTERNAL),
                2: (404, grpc.StatusCode.NOT_FOUND), 3: (400, grpc.StatusCode.INVALID_ARGUMENT),
                4: (503, grpc.StatusCode.UNAVAILABLE), 5: (501, grpc.StatusCode.UNIMPLEMENTED),
                6: (400, grpc.StatusCode.ALREADY_EXISTS), 7: (400, grpc.StatusCode.CANCELLED)}
    http = httpclient.InferenceServerClient(worker.http)
    rpc = grpcclient.InferenceServerClient(worker.grpc)
    try:
        for code, (status, rpc_code) in expected.items():
            with pytest.raises(InferenceServerException, match=f"code {code}") as err:
                _flaky(http, 100 + code)
            assert err.value.status() == str(status), code
            tensor = grpcclient.InferInput("X", [1], "INT32")
            tensor.set_data_from_numpy(np.array([100 + code], np.int32))
            with pytest.raises(InferenceServerException, match=f"code {code}") as err:
                rpc.infer("flaky", [tensor])
            assert err.value.status() == str(rpc_code), code
    finally:
        http.close()
        rpc.close()


def test_only_the_outputs_asked_for_or_declared_are_sent(worker):
    """A tensor the config does not declare was sent to a client that named no outputs; Triton's
    core asks for all declared outputs then, and its python backend drops the rest."""
    for module, address in ((httpclient, worker.http), (grpcclient, worker.grpc)):
        client = module.InferenceServerClient(address)
        inp = module.InferInput("X", [1], "INT32")
        inp.set_data_from_numpy(np.array([21], np.int32))
        result = client.infer("extra", [inp])
        names = [o["name"] if isinstance(o, dict) else o.name
                 for o in (result.get_response()["outputs"] if module is httpclient
                           else result.get_response().outputs)]  # fmt: skip
        assert sorted(names) == ["ASKED", "Y"] and result.as_numpy("Y").tolist() == [42]
        assert result.as_numpy("ASKED").tolist() == [b"ASKED,Y"]  # what the model was told
        client.close()


def test_auto_complete_config_fills_the_config(worker):
    client = httpclient.InferenceServerClient(worker.http)
    config = client.get_model_config("auto")
    assert config["max_batch_size"] == 4 and "dynamic_batching" in config
    assert [i["name"] for i in config["input"]] == ["IN"]
    inp = httpclient.InferInput("IN", [3, 2], "FP32")
    inp.set_data_from_numpy(np.ones((3, 2), np.float32))
    assert client.infer("auto", [inp]).as_numpy("OUT").tolist() == [[10, 10]] * 3
    client.close()


def test_auto_complete_fills_in_a_config_that_gives_part_of_a_tensor(worker):
    """add_input for an input the config names without dims left dims empty (every request
    then failed its shape check), and a model raising max_batch_size over the config's was
    refused; both are Triton's auto-complete."""
    client = httpclient.InferenceServerClient(worker.http)
    try:
        config = client.get_model_config("partial")
        assert config["max_batch_size"] == 8
        assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
            ("IN", "TYPE_FP32", [4])]
        assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [
            ("OUT", "TYPE_FP32", [4])]
        inp = httpclient.InferInput("IN", [2, 4], "FP32")
        inp.set_data_from_numpy(np.zeros((2, 4), np.float32))
        assert client.infer("partial", [inp]).as_numpy("OUT").tolist() == [[1.0] * 4] * 2
    finally:
        client.close()


def test_initialize_gets_tritons_args_and_instances_are_processes(worker):
    client = httpclient.InferenceServerClient(worker.http, concurrency=4)
    inp = httpclient.InferInput("X", [1], "INT32")
    inp.set_data_from_numpy(np.array([1], np.int32))
    results = [client.async_infer("lifecycle", [inp]) for _ in range(4)]
    results = [r.get_result() for r in results]
    args = json.loads(results[0].as_numpy("ARGS")[0])
    assert set(args) == {
        "model_config", "model_instance_kind", "model_instance_name",
        "model_instance_device_id", "model_repository", "model_version", "model_name",
    }  # fmt: skip
    assert all(isinstance(v, str) for v in args.values())
    assert args["model_instance_kind"] == "CPU" and args["model_version"] == "1"
    assert args["model_repository"].endswith("lifecycle")
    assert json.loads(args["model_config"])["name"] == "lifecycle"
    assert len({int(r.as_numpy("PID")[0]) for r in results}) == 2
    client.close()


def test_sigint_finalizes_every_instance(worker):
    worker.process.send_signal(signal.SIGINT)
    assert worker.process.wait(60) == 0
    names = sorted(worker.marker.read_text().split())
    assert names == ["lifecycle_0_0", "lifecycle_0_1"]


@pytest.mark.parametrize("flag", ["--disable-auto-complete-config=true",
                                  "--strict-model-config=true"])  # fmt: skip
def test_without_auto_complete_the_config_is_served_as_written(tmp_path, flag):
    """Triton's --disable-auto-complete-config (and its older --strict-model-config=true): the
    backend does not fill in the config; `auto` is then served as its config.pbtxt says."""
    config, code = MODELS["auto"]
    (tmp_path / "auto" / "1").mkdir(parents=True)
    (tmp_path / "auto" / "config.pbtxt").write_text(config)
    (tmp_path / "auto" / "1" / "model.py").write_text(code)
    served = start_worker(tmp_path, flag)
    try:
        served_config = httpclient.InferenceServerClient(served.http).get_model_config("auto")
    finally:
        served.stop()
    assert served_config.get("max_batch_size", 0) == 0 and not served_config.get("input")
    assert not any("has no effect" in line for line in served.output)


LOGS = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        logger = pb_utils.Logger
        logger.log_info("model-info")
        logger.log_warn("model-warning")
        logger.log_error("model-error")
        logger.log_verbose("model-verbose")
        logger.log("model-leveled", pb_utils.LogLevel.WARNING)
        logger.log("model-nested", logger.LogLevel.ERROR)

    def execute(self, requests):
        return []
"""


@pytest.mark.parametrize(("flags", "shown"), [
    ((), {"model-info", "model-warning", "model-error", "model-leveled", "model-nested"}),
    (("--log-info", "false", "--log-verbose", "1"),
     {"model-warning", "model-error", "model-verbose", "model-leveled", "model-nested"}),
])  # fmt: skip
def test_a_models_log_lines_follow_the_workers_log_flags_and_file(tmp_path, flags, shown):
    """pb_utils.Logger printed every level to stderr whatever --log-* said, and never into
    --log-file; Triton's server settings decide which lines appear, and where."""
    repo = tmp_path / "repo"
    (repo / "logs" / "1").mkdir(parents=True)
    (repo / "logs" / "config.pbtxt").write_text(
        'name: "logs"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]\n')
    (repo / "logs" / "1" / "model.py").write_text(LOGS)
    log_file = tmp_path / "server.log"
    served = start_worker(repo, "--log-file", str(log_file), *flags)
    try:
        text = log_file.read_text()
    finally:
        served.stop()
    found = {word for word in ("model-info", "model-warning", "model-error", "model-verbose",
                               "model-leveled", "model-nested") if word in text}  # fmt: skip
    assert found == shown, text
    assert "WARNING python model: model-warning" in text
    assert "model-warning" not in "".join(served.output)  # the file, not stderr


def test_tensors_cross_dlpack_both_ways():
    """torch.from_dlpack(pb_tensor) needs the protocol's __dlpack__ (it raised AttributeError);
    from_dlpack takes a torch tensor or a capsule, sharing host memory."""
    import torch

    from analyzer.worker.backends.pb_utils import triton_python_backend_utils as pb

    tensor = pb.Tensor("X", np.arange(6, dtype=np.float32).reshape(2, 3))
    shared = torch.from_dlpack(tensor)
    shared[0, 0] = 42.0
    assert tensor.as_numpy()[0, 0] == 42.0 and list(shared.shape) == [2, 3]
    back = pb.Tensor.from_dlpack("Y", torch.ones(4, dtype=torch.int64))
    assert back.as_numpy().tolist() == [1, 1, 1, 1] and back.triton_dtype() == 9  # TYPE_INT64
    capsule = pb.Tensor.from_dlpack("Z", torch.utils.dlpack.to_dlpack(torch.zeros(2)))
    assert capsule.as_numpy().tolist() == [0.0, 0.0]


def test_bf16_and_read_only_tensors_cross_dlpack():
    """Triton exports every tensor it holds through DLPack: BF16 (which numpy cannot export or
    import) failed both ways and in triton_dtype(), and a read-only array (np.broadcast_to,
    np.frombuffer of bytes) raised numpy's BufferError."""
    import ml_dtypes
    import torch

    from analyzer.worker.backends.pb_utils import triton_python_backend_utils as pb

    tensor = pb.Tensor("X", np.arange(4, dtype=ml_dtypes.bfloat16))
    assert tensor.triton_dtype() == 14  # TYPE_BF16
    shared = torch.from_dlpack(tensor)
    assert shared.dtype == torch.bfloat16 and shared.tolist() == [0.0, 1.0, 2.0, 3.0]
    shared[0] = 8.0  # the same memory
    assert float(tensor.as_numpy()[0]) == 8.0
    via_capsule = torch.utils.dlpack.from_dlpack(tensor.to_dlpack())
    assert via_capsule.dtype == torch.bfloat16 and via_capsule.tolist() == [8.0, 1.0, 2.0, 3.0]
    for source in (torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
                   torch.utils.dlpack.to_dlpack(torch.tensor([1.5, -2.0], dtype=torch.bfloat16))):
        back = pb.Tensor.from_dlpack("Y", source)
        assert back.as_numpy().dtype == ml_dtypes.bfloat16 and back.triton_dtype() == 14
        assert back.as_numpy().astype(np.float32).tolist() == [1.5, -2.0]
    for read_only in (np.broadcast_to(np.float32(3), (3,)),
                      np.frombuffer(np.arange(3, dtype=np.int32).tobytes(), dtype=np.int32)):
        assert not read_only.flags.writeable
        assert torch.from_dlpack(pb.Tensor("R", read_only)).tolist() == read_only.tolist()
    with pytest.raises(pb.TritonModelException, match="BYTES tensor cannot be exported"):
        pb.Tensor("S", np.array([b"a"], dtype=np.object_)).to_dlpack()


def test_pb_utils_module_helpers_match_tritons():
    """TRITON_STRING_TO_NUMPY was missing; serialize_byte_tensor returned a uint8 array where
    Triton's returns bytes (and None for a tensor that is not of objects or bytes)."""
    from analyzer.worker.backends.pb_utils import triton_python_backend_utils as pb

    assert pb.TRITON_STRING_TO_NUMPY["TYPE_FP32"] is np.float32
    assert pb.TRITON_STRING_TO_NUMPY["TYPE_BOOL"] is bool
    assert pb.triton_string_to_numpy("TYPE_STRING") is np.object_
    packed = pb.serialize_byte_tensor(np.array([b"ab", "c", 5], dtype=np.object_))
    assert packed == b"\x02\x00\x00\x00ab\x01\x00\x00\x00c\x01\x00\x00\x005"
    assert pb.serialize_byte_tensor(np.array([b"xy"], dtype=np.bytes_)) == b"\x02\x00\x00\x00xy"
    assert pb.serialize_byte_tensor(np.zeros(2, np.float32)) is None
    assert pb.serialize_byte_tensor(np.array([], dtype=np.object_)) == ()
    assert pb.deserialize_bytes_tensor(packed).tolist() == [b"ab", b"c", b"5"]


def test_a_request_and_a_sender_check_their_arguments_as_tritons():
    """InferenceRequest took any keyword (a misspelled `paramters=` was dropped without a word)
    and any correlation id; requested_output_names() is a set, as Triton's; send() took any
    flags with the final bit set as final, and a model that is not decoupled could send the
    final flag alone first (its client then got "the model sent no response")."""
    from analyzer.worker.backends.pb_utils import triton_python_backend_utils as pb

    with pytest.raises(TypeError):
        pb.InferenceRequest(model_name="m", inputs=[], requested_output_names=[],
                            paramters={"a": 1})  # fmt: skip
    with pytest.raises(pb.TritonModelException, match="Correlation ID must be integer or string"):
        pb.InferenceRequest(model_name="m", inputs=[], requested_output_names=[],
                            correlation_id=1.5)  # fmt: skip
    request = pb.InferenceRequest(
        "id", 7, [], ["B", "A", "B"], "m", -1, 0, 0,
        pb.PreferredMemory(pb.TRITONSERVER_MEMORY_CPU), pb.InferenceTrace(), {"k": "v"})
    assert request.requested_output_names() == {"A", "B"}
    assert json.loads(request.parameters()) == {"k": "v"} and request.correlation_id() == 7
    sender = request.get_response_sender()
    with pytest.raises(pb.TritonModelException, match="Unsupported flag provided"):
        sender.send(pb.InferenceResponse(), flags=5)
    with pytest.raises(pb.TritonModelException, match="final flag alone before its response"):
        sender.send(flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    sender.send(pb.InferenceResponse())
    sender.send(flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)  # Triton's second form
    assert len(sender.responses) == 1 and sender.closed


def test_a_bls_request_may_name_its_preferred_memory():
    """pb_utils.PreferredMemory and the TRITONSERVER_MEMORY_* names did not exist: a model that
    builds its BLS requests as Triton's README shows failed with an AttributeError."""
    from analyzer.worker.backends.pb_utils import triton_python_backend_utils as pb

    request = pb.InferenceRequest(
        model_name="add_sub", requested_output_names=["OUTPUT0"],
        inputs=[pb.Tensor("INPUT0", np.zeros(4, dtype=np.float32))],
        preferred_memory=pb.PreferredMemory(pb.TRITONSERVER_MEMORY_CPU, 0))
    assert [t.name() for t in request.inputs()] == ["INPUT0"]
    memory = pb.PreferredMemory(pb.TRITONSERVER_MEMORY_GPU)
    assert memory.preferred_memory_type == pb.MemoryType.TRITONSERVER_MEMORY_GPU
    assert memory.preferred_device_id == 0


def test_a_request_has_tritons_set_flags_and_trace():
    """set_flags and trace() did not exist (a model passing its request's trace on to a BLS
    request, as Triton's docs show, failed with an AttributeError)."""
    from analyzer.worker.backends.pb_utils import triton_python_backend_utils as pb

    request = pb.InferenceRequest(model_name="m", inputs=[], requested_output_names=[])
    request.set_flags(pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START)
    assert request.flags() == 1
    bls = pb.InferenceRequest(model_name="n", inputs=[], requested_output_names=[],
                              trace=request.trace())  # fmt: skip
    assert bls.trace().get_context() is None


def test_is_cancelled_asks_the_worker_only_while_the_request_is_open():
    """A request kept by a model that is not decoupled was asked about by its index in the call:
    asked during a later call, the worker answered about that call's request; asked between
    calls, the question waited 5 s for a reader. Serials now outlive calls, and a request asked
    after its call is answered at once, in the model's process: not cancelled."""
    import os
    import socket
    import threading
    from multiprocessing.connection import Connection

    from analyzer.worker.backends.python_stub import Stub

    ours, theirs = socket.socketpair()
    stub = Stub(Connection(os.dup(ours.fileno())), ours)
    worker = Connection(os.dup(theirs.fileno()))
    stub.calling = range(5, 7)
    assert stub._is_cancelled(3) is False and not worker.poll(0.2)  # asked nothing

    def answer():
        question = worker.recv()
        assert question["op"] == "is_cancelled" and question["request"] == 6
        worker.send({"op": "bls_reply", "id": question["id"], "cancelled": True, "fd": False})

    thread = threading.Thread(target=answer)
    thread.start()
    assert stub._is_cancelled(6) is True
    thread.join(10)
    for end in (stub.conn, worker, ours, theirs):
        end.close()


PAIR = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):  # each answer: how many requests this call held
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "N", np.array([len(requests)], dtype=np.int32))]) for _ in requests]
'''

STARTER = '''
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    async def execute(self, requests):
        out = []
        for request in requests:
            call = lambda: pb_utils.InferenceRequest(
                model_name="pair", requested_output_names=["N"],
                inputs=[pb_utils.Tensor("X", np.zeros((1, 1), dtype=np.int32))])
            first, second = call().async_exec(), call().async_exec()  # both under way now
            assert asyncio.isfuture(first) and asyncio.isfuture(second)
            done, _ = await asyncio.wait([first, second])  # a TypeError for coroutines
            sizes = [int(pb_utils.get_output_tensor_by_name(f.result(), "N").as_numpy()[0])
                     for f in (first, second)]
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("SIZES", np.array(sizes, dtype=np.int32))]))
        return out
'''

HALVE = '''
import torch
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):  # Triton's README form: torch through DLPack, both ways
        out = []
        for request in requests:
            x = torch.from_dlpack(pb_utils.get_input_tensor_by_name(request, "X").to_dlpack())
            assert x.dtype == torch.bfloat16
            y = pb_utils.Tensor.from_dlpack("Y", torch.utils.dlpack.to_dlpack(x / 2))
            out.append(pb_utils.InferenceResponse([y]))
        return out
'''


def test_async_exec_starts_the_call_and_bf16_crosses_dlpack_in_a_served_model(tmp_path):
    """async_exec() returned a coroutine: nothing was sent until it was awaited, so two calls
    started one after the other ran one at a time (here: two batches of one, each after the
    10 s queue delay), and asyncio.wait() refused them. Triton's returns a Future of a call
    already under way. And a BF16 tensor through torch's DLPack, as a served model uses it."""
    import ml_dtypes
    repo = tmp_path / "repo"
    for name, code in (("pair", PAIR), ("starter", STARTER), ("halve", HALVE)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(code)
    (repo / "pair" / "config.pbtxt").write_text(
        'name: "pair" backend: "python" max_batch_size: 2\n'
        'input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 10000000 }')
    (repo / "starter" / "config.pbtxt").write_text(
        'name: "starter" backend: "python" max_batch_size: 0\n'
        'input [ { name: "GO" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "SIZES" data_type: TYPE_INT32 dims: [ 2 ] } ]')
    (repo / "halve" / "config.pbtxt").write_text(
        'name: "halve" backend: "python" max_batch_size: 0\n'
        'input [ { name: "X" data_type: TYPE_BF16 dims: [ 3 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_BF16 dims: [ 3 ] } ]')
    served = start_worker(repo)
    try:
        client = httpclient.InferenceServerClient(served.http)
        go = httpclient.InferInput("GO", [1], "INT32")
        go.set_data_from_numpy(np.array([1], np.int32))
        assert client.infer("starter", [go]).as_numpy("SIZES").tolist() == [2, 2]
        client.close()
        values = np.array([3.0, -1.0, 0.5], ml_dtypes.bfloat16)
        for module, address in ((httpclient, served.http), (grpcclient, served.grpc)):
            # binary BF16 answers were 4-byte floats labelled BF16 over REST
            with module.InferenceServerClient(address) as client:
                x = module.InferInput("X", [3], "BF16")
                x.set_data_from_numpy(values)
                halved = client.infer("halve", [x]).as_numpy("Y")
                assert halved.dtype == ml_dtypes.bfloat16, module
                assert halved.astype(np.float32).tolist() == [1.5, -0.5, 0.25], module
        with httpclient.InferenceServerClient(served.http) as client:  # JSON: exact as floats
            x = httpclient.InferInput("X", [3], "BF16")
            x.set_data_from_numpy(values)
            wanted = [httpclient.InferRequestedOutput("Y", binary_data=False)]
            answer = client.infer("halve", [x], outputs=wanted).get_response()["outputs"][0]
            assert answer["datatype"] == "BF16" and answer["data"] == [1.5, -0.5, 0.25]
    finally:
        served.stop()


BACKGROUND = '''
import asyncio
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    task = None

    async def later(self):
        await asyncio.sleep(0.05)
        return threading.current_thread().name

    async def execute(self, requests):
        if self.task is None:  # the first call starts a task and returns
            self.task = asyncio.create_task(self.later())
            name = "started"
        else:  # the next waits for it: on which thread did it run?
            name = await asyncio.wait_for(asyncio.shield(self.task), 30)
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Y", np.array([name.encode()], dtype=np.object_))]) for _ in requests]
'''


def test_a_task_an_async_execute_starts_runs_between_calls(tmp_path):
    """A model that is not decoupled ran its async execute() on a loop that turned only
    during its calls: a task it started (asyncio.create_task) stalled until the next call and
    then ran on the call's thread. Triton's stub runs its loop for ever on a thread of its
    own; the task now does too."""
    python_models(tmp_path, {"background": BACKGROUND},
                  'max_batch_size: 0\n'
                  'input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
                  'output [ { name: "Y" data_type: TYPE_STRING dims: [ 1 ] } ]\n')
    served = start_worker(tmp_path)
    try:
        with httpclient.InferenceServerClient(served.http) as client:
            x = httpclient.InferInput("X", [1], "INT32")
            x.set_data_from_numpy(np.array([1], np.int32))
            names = [client.infer("background", [x]).as_numpy("Y")[0] for _ in range(3)]
        assert names == [b"started", b"asyncio", b"asyncio"]
    finally:
        served.stop()
