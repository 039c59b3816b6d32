"""Triton's system shared-memory extension on both protocols, driven by tritonclient's own
shared-memory utilities: inputs read from a region, outputs written into one, the status and
unregister calls; and what a hostile or careless client cannot do with it."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from serving import EXAMPLES, start_worker
from tritonclient.utils import InferenceServerException


@pytest.fixture
def regions():
    """An input region holding add_sub's two inputs and an empty output region."""
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    b = np.ones((1, 4), np.float32)
    tag = uuid.uuid4().hex[:8]
    keys = (f"/ma-test-in-{tag}", f"/ma-test-out-{tag}")
    handles = [shm.create_shared_memory_region(f"r{i}", key, 32) for i, key in enumerate(keys)]
    shm.set_shared_memory_region(handles[0], [a, b])
    yield keys, handles, a, b
    for handle in handles:
        shm.destroy_shared_memory_region(handle)


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_inputs_and_outputs_through_shared_memory(examples_worker, regions, module):
    keys, handles, a, b = regions
    url = examples_worker.http if module is httpclient else examples_worker.grpc
    client = module.InferenceServerClient(url)
    try:
        client.unregister_system_shared_memory()
        client.register_system_shared_memory("in", keys[0], 32)
        client.register_system_shared_memory("out", keys[1], 32)
        status = client.get_system_shared_memory_status()
        names = {r["name"] for r in status} if module is httpclient else set(status.regions)
        assert names == {"in", "out"}
        inputs = [module.InferInput(n, [1, 4], "FP32") for n in ("INPUT0", "INPUT1")]
        inputs[0].set_shared_memory("in", 16)
        inputs[1].set_shared_memory("in", 16, offset=16)
        outputs = [module.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
        outputs[0].set_shared_memory("out", 16)
        outputs[1].set_shared_memory("out", 16, offset=16)
        result = client.infer("add_sub", inputs, outputs=outputs)
        assert result.get_output("OUTPUT0") is not None
        got = [shm.get_contents_as_numpy(handles[1], np.float32, [1, 4], offset=o)
               for o in (0, 16)]  # fmt: skip
        np.testing.assert_array_equal(got[0], a + b)
        np.testing.assert_array_equal(got[1], a - b)
        # too small for the output: a clear error, nothing written past the region
        small = module.InferRequestedOutput("OUTPUT0")
        small.set_shared_memory("out", 8)
        with pytest.raises(InferenceServerException, match="its shared memory region 'out' was "
                                                          "given 8"):  # fmt: skip
            client.infer("add_sub", inputs, outputs=[small])
        client.unregister_system_shared_memory("in")
        with pytest.raises(InferenceServerException, match="Unable to find shared memory region"):
            client.infer("add_sub", inputs, outputs=outputs)
    finally:
        client.unregister_system_shared_memory()
        client.close()


def test_what_a_client_cannot_register(examples_worker, regions):
    keys, _, _, _ = regions
    client = httpclient.InferenceServerClient(examples_worker.http)
    try:
        for key, needle in (("/../etc/passwd", "must name one object under /dev/shm"),
                            ("a/b", "must name one object under /dev/shm"),
                            ("/no-such-region-here", "Unable to open shared memory region")):
            with pytest.raises(InferenceServerException, match=needle):
                client.register_system_shared_memory("x", key, 16)
        with pytest.raises(InferenceServerException, match="does not fit"):
            client.register_system_shared_memory("x", keys[0], 64)  # the object has 32 bytes
        client.register_system_shared_memory("x", keys[0], 32)
        with pytest.raises(InferenceServerException, match="already in manager"):
            client.register_system_shared_memory("x", keys[0], 32)
        with pytest.raises(InferenceServerException, match="no CUDA support"):
            client.register_cuda_shared_memory("c", b"handle", 0, 16)
        assert client.get_cuda_shared_memory_status() == []
    finally:
        client.unregister_system_shared_memory()
        client.close()


def test_the_shared_memory_api_can_be_restricted(tmp_path, regions):
    keys, _, _, _ = regions
    served = start_worker(EXAMPLES, "--http-restricted-api", "shared-memory:token=s3cret")
    client = httpclient.InferenceServerClient(served.http)
    try:
        with pytest.raises(InferenceServerException) as refused:
            client.register_system_shared_memory("x", keys[0], 32)
        assert refused.value.status() == "403"
        client.register_system_shared_memory("x", keys[0], 32, headers={"token": "s3cret"})
    finally:
        client.close()
        assert served.stop() == 0


def test_an_input_in_shared_memory_is_capped_as_a_request_body_is(regions):
    """A region is the client's to size: one input copied out of it may not exceed the worker's
    input limit (--http-max-input-size, the cap an HTTP body has), on gRPC too."""
    keys, _, _, _ = regions
    served = start_worker(EXAMPLES, "--http-max-input-size", "24")
    client = grpcclient.InferenceServerClient(served.grpc)
    try:
        client.register_system_shared_memory("in", keys[0], 32)
        big = grpcclient.InferInput("INPUT0", [1, 8], "FP32")
        big.set_shared_memory("in", 32)
        small = grpcclient.InferInput("INPUT1", [1, 4], "FP32")
        small.set_shared_memory("in", 16)
        with pytest.raises(InferenceServerException, match="over the worker's input limit of 24"):
            client.infer("add_sub", [big, small])
    finally:
        client.close()
        assert served.stop() == 0


def test_an_object_shrunk_after_registering_is_the_clients_error(tmp_path):
    """The client owns the object and may shrink it after registering it. The regions were
    mapped, and reading or writing the pages past the object's new end killed the worker with
    SIGBUS (every client lost it); now that request gets a 400 naming the region, and the
    worker goes on serving."""
    import os

    key = f"ma-test-shrink-{uuid.uuid4().hex[:8]}"
    path = f"/dev/shm/{key}"
    with open(path, "wb") as f:
        f.write(b"\0" * 64)
    served = start_worker(EXAMPLES)
    client = httpclient.InferenceServerClient(served.http)
    try:
        client.register_system_shared_memory("in", "/" + key, 32)
        client.register_system_shared_memory("out", "/" + key, 32, offset=32)
        os.truncate(path, 0)
        inputs = [httpclient.InferInput(n, [1, 4], "FP32") for n in ("INPUT0", "INPUT1")]
        inputs[0].set_shared_memory("in", 16)
        inputs[1].set_data_from_numpy(np.ones((1, 4), np.float32))
        with pytest.raises(InferenceServerException,
                           match=f"region 'in': its object '/{key}' now holds 0 bytes"):
            client.infer("add_sub", inputs)
        inputs[0].set_data_from_numpy(np.ones((1, 4), np.float32))
        out = httpclient.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory("out", 16)
        with pytest.raises(InferenceServerException,
                           match=f"region 'out': its object '/{key}' now holds 0 bytes"):
            client.infer("add_sub", inputs, outputs=[out])
        assert served.process.poll() is None
        result = client.infer("add_sub", inputs)  # the worker still serves
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 4), 2.0))
    finally:
        client.close()
        os.unlink(path)
        assert served.stop() == 0


def test_a_huge_sparse_object_registers_without_mapping_it(tmp_path):
    """A region is not mapped, so a sparse 1 TiB object registers (it once failed mmap with
    ENOMEM under a memory limit, a 500); what one input may read of it stays capped."""
    from analyzer.worker import shm as shm_module
    from analyzer.worker.errors import InferError

    with open(tmp_path / "big", "wb") as f:
        f.truncate(1 << 40)
    registry = shm_module.SharedMemoryRegistry(str(tmp_path), max_read_bytes=1 << 20)
    try:
        registry.register("r", "/big", 0, 1 << 40)
        assert registry.read("r", (1 << 40) - 8, 8) == b"\0" * 8
        with pytest.raises(InferError, match="over the worker's input limit"):
            registry.read("r", 0, 2 << 20)
    finally:
        registry.close()


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_an_output_region_not_registered_is_refused_before_the_model_runs(examples_worker,
                                                                          module):
    """Over HTTP the model ran, and then the client got a 500 saying the model's outputs could
    not be sent; the region is the client's mistake, found before the model runs (a 400, as
    gRPC's INVALID_ARGUMENT)."""
    url = examples_worker.http if module is httpclient else examples_worker.grpc
    client = module.InferenceServerClient(url)
    try:
        def executed() -> int:
            stats = (client.get_inference_statistics("add_sub") if module is httpclient
                     else client.get_inference_statistics("add_sub", as_json=True))
            return int(stats["model_stats"][0]["inference_stats"]["success"].get("count", 0))

        inputs = [module.InferInput(n, [1, 4], "FP32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        out = module.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory("nowhere", 16)
        before = executed()
        with pytest.raises(InferenceServerException,
                           match="Unable to find shared memory region: 'nowhere'") as err:
            client.infer("add_sub", inputs, outputs=[out])
        if module is httpclient:
            assert err.value.status() == "400"
        assert executed() == before
    finally:
        client.close()


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_an_input_the_model_does_not_take_is_refused_before_its_region_is_read(
        examples_worker, regions, module):  # fmt: skip
    """An input in shared memory was copied out (up to the input cap each) before its name was
    checked: a 1 KB request naming a thousand inputs the model does not take made the worker
    copy a thousand regions. Here the region cannot be read (past its end): the answer names the
    input, so nothing was read."""
    keys, _, _, _ = regions
    url = examples_worker.http if module is httpclient else examples_worker.grpc
    client = module.InferenceServerClient(url)
    try:
        client.register_system_shared_memory("probe", keys[0], 32)
        bogus = module.InferInput("BOGUS", [1, 8], "FP32")
        bogus.set_shared_memory("probe", 32, offset=16)
        with pytest.raises(InferenceServerException, match="unexpected inference input 'BOGUS'"):
            client.infer("add_sub", [bogus])
    finally:
        client.unregister_system_shared_memory("probe")
        client.close()
