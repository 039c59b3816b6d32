"""What a load leaves in the worker: a failed load gives back what it used."""

from __future__ import annotations

import sys

import pytest
import tritonclient.http as httpclient
from serving import python_models, start_worker
from tritonclient.utils import InferenceServerException

REFUSES = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        raise pb_utils.TritonModelException("this model refuses its warm-up")
'''
ELEMENTS = 16 << 20  # 64 MiB of FP32 per warm-up request


def _anon_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        fields = dict(line.split(":", 1) for line in status)
    return int(fields["RssAnon"].split()[0])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_failed_loads_do_not_grow_the_worker(tmp_path):
    """Each failed load of a model with 64 MiB of random warm-up data left 64 MiB more in the
    worker (measured 42 -> 559 MiB over five loads of 100 MiB): the python instance kept its
    last batch, and an error's traceback kept the batch's frame, until after the unload."""
    python_models(tmp_path, {"refuses": REFUSES},
                  'max_batch_size: 1\n'
                  f'input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ {ELEMENTS} ] }} ]\n'
                  'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
                  'instance_group [ { count: 1 kind: KIND_CPU } ]\n'
                  'model_warmup [ { name: "w" batch_size: 1 inputs { key: "IN" value: { '
                  f'data_type: TYPE_FP32 dims: [ {ELEMENTS} ] random_data: true }} }} }} ]\n')
    served = start_worker(tmp_path, "--model-control-mode", "explicit")
    try:
        with httpclient.InferenceServerClient(served.http, network_timeout=300) as client:
            sizes = []
            for _ in range(4):
                with pytest.raises(InferenceServerException, match="warm"):
                    client.load_model("refuses")
                sizes.append(_anon_kib(served.process.pid))
    finally:
        served.stop()
    grown = (sizes[-1] - sizes[0]) / 1024
    assert grown < 32, f"the worker grew by {grown:.0f} MiB over three failed loads: {sizes}"
