"""Custom metrics of python models (pb_utils.MetricFamily / Metric), as Triton serves them: on the
metrics port after Triton's own families, shared by name, released when the model ends."""

from __future__ import annotations

import re
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient
from serving import python_models, start_worker
from tritonclient.utils import InferenceServerException

from analyzer.worker.custom_metrics import MAX_FAMILIES, CustomMetricError, CustomMetrics

# ---- the registry ---------------------------------------------------------------------------


def test_a_family_is_known_by_name_and_a_series_by_labels():
    registry = CustomMetrics()
    first = registry.family("latency_ns", "Cumulative latency", "counter")
    again = registry.family("latency_ns", "another description", "counter")
    with pytest.raises(CustomMetricError, match="exists as a counter; it cannot be made a gauge"):
        registry.family("latency_ns", "x", "gauge")
    a = registry.metric(first, {"model": "m", "version": "1"}, None)
    b = registry.metric(again, {"version": "1", "model": "m"}, None)  # the same series
    registry.apply(a, "increment", 5)
    registry.apply(b, "increment", 2.5)
    registry.apply(a, "increment", -1)  # a counter does not go down (the model checks first)
    assert registry.value(a) == registry.value(b) == 7.5
    assert registry.lines() == ["# HELP latency_ns Cumulative latency",
                                "# TYPE latency_ns counter",
                                'latency_ns{model="m",version="1"} 7.5']  # fmt: skip
    registry.release_metric(a)
    assert registry.value(b) == 7.5  # still held by b
    registry.release_metric(b)
    assert registry.lines() == []  # a family with no series is not written


def test_histograms_gauges_and_what_is_refused():
    registry = CustomMetrics()
    hist = registry.family("size_bytes", 'sizes "in"\nbytes', "histogram")
    metric = registry.metric(hist, {"path": 'a"b\\c'}, [10, 100.5])
    for value in (3, 10, 50, 1e9):
        registry.apply(metric, "observe", value)
    assert registry.lines() == [
        '# HELP size_bytes sizes "in"\\nbytes',
        "# TYPE size_bytes histogram",
        'size_bytes_bucket{path="a\\"b\\\\c",le="10"} 2',
        'size_bytes_bucket{path="a\\"b\\\\c",le="100.5"} 3',
        'size_bytes_bucket{path="a\\"b\\\\c",le="+Inf"} 4',
        'size_bytes_sum{path="a\\"b\\\\c"} 1000000063',
        'size_bytes_count{path="a\\"b\\\\c"} 4',
    ]
    with pytest.raises(CustomMetricError, match="not supported for histogram"):
        registry.value(metric)
    with pytest.raises(CustomMetricError, match="finite and increasing"):
        registry.metric(hist, None, [5, 1])
    with pytest.raises(CustomMetricError, match="with these labels and other buckets"):
        registry.metric(hist, {"path": 'a"b\\c'}, [1, 2])
    gauge = registry.family("queue", "", "gauge")
    level = registry.metric(gauge, None, None)
    registry.apply(level, "set", 4)
    registry.apply(level, "increment", -6)
    assert registry.value(level) == -2
    with pytest.raises(CustomMetricError, match="takes no buckets"):
        registry.metric(gauge, None, [1.0])
    with pytest.raises(CustomMetricError, match="not a Prometheus label name"):
        registry.metric(gauge, {"bad-name": "x"}, None)
    with pytest.raises(CustomMetricError, match="must have a string value"):
        registry.metric(gauge, {"n": 1}, None)
    with pytest.raises(CustomMetricError, match="not a Prometheus metric name"):
        registry.family("9lives", "", "counter")
    with pytest.raises(CustomMetricError, match="the worker's own namespace"):
        registry.family("nv_inference_count", "", "counter")
    registry.release_family(gauge)  # the family goes, with its metrics
    with pytest.raises(CustomMetricError, match="deleted"):
        registry.value(level)


def test_a_model_cannot_grow_the_registry_without_end():
    registry = CustomMetrics()
    for n in range(MAX_FAMILIES):
        registry.family(f"f{n}", "", "counter")
    with pytest.raises(CustomMetricError, match=f"holds {MAX_FAMILIES} already"):
        registry.family("one_more", "", "counter")


# ---- a python model's metrics on the worker's metrics port ------------------------------------

MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        # the kind as in Triton's 23.05 example (module level) and as in its README
        self.count = pb_utils.MetricFamily(
            name="requests_seen", description="Requests this model saw",
            kind=pb_utils.COUNTER).Metric(labels={"model": args["model_name"], "version": "1"})
        self.depth = pb_utils.MetricFamily(
            "batch_depth", "Requests in the last batch", pb_utils.MetricFamily.GAUGE).Metric()
        family = pb_utils.MetricFamily("input_value", "Inputs seen",
                                       pb_utils.MetricFamily.HISTOGRAM)
        self.values = family.Metric(labels={"model": args["model_name"]}, buckets=[1.0, 10.0])

    def execute(self, requests):
        responses = []
        self.depth.set(len(requests))
        for request in requests:
            value = float(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            try:
                if value < 0:
                    self.count.increment(value)  # a counter does not go down: an error
                self.count.increment(1)
                self.values.observe(value)
            except pb_utils.TritonModelException as err:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(err))))
                continue
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                "OUT", np.array([self.count.value()], dtype=np.float64))]))
        return responses
'''

CLASH = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.MetricFamily("requests_seen", "the same name, another kind",
                              pb_utils.MetricFamily.GAUGE)

    def execute(self, requests):
        return []
'''


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    repo = tmp_path_factory.mktemp("custom_metrics")
    python_models(repo, {"counted": MODEL, "clash": CLASH},
                  'max_batch_size: 0\n'
                  'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
                  'output [ { name: "OUT" data_type: TYPE_FP64 dims: [ 1 ] } ]\n')
    served = start_worker(repo, "--model-control-mode", "explicit", "--load-model", "counted")
    yield served
    served.stop()


def _infer(client, value: float) -> float:
    tensor = httpclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.array([value], dtype=np.float32))
    return float(client.infer("counted", [tensor]).as_numpy("OUT")[0])


def _scrape(worker) -> str:
    with urllib.request.urlopen(worker.metrics, timeout=10) as response:
        return response.read().decode()


def test_a_models_metrics_are_served_with_the_workers(worker):
    """pb_utils.MetricFamily did not exist: a Triton model that defines custom metrics failed to
    load."""
    with httpclient.InferenceServerClient(worker.http) as client:
        assert [_infer(client, v) for v in (0.5, 5, 50)] == [1, 2, 3]  # value() after each
        with pytest.raises(InferenceServerException, match="must be non-negative"):
            _infer(client, -2)
        text = _scrape(worker)
        assert "# HELP requests_seen Requests this model saw\n# TYPE requests_seen counter\n" \
            'requests_seen{model="counted",version="1"} 3\n' in text  # fmt: skip
        assert "# TYPE batch_depth gauge\nbatch_depth 1\n" in text  # no labels, no braces
        assert 'input_value_bucket{model="counted",le="1"} 1\n' in text
        assert 'input_value_bucket{model="counted",le="10"} 2\n' in text
        assert 'input_value_bucket{model="counted",le="+Inf"} 3\n' in text
        assert 'input_value_sum{model="counted"} 55.5\n' in text
        assert text.index("nv_inference_count") < text.index("requests_seen")  # Triton's first
        assert re.search(r'nv_inference_request_failure\{model="counted",version="1"\} 1\n', text)

        with pytest.raises(InferenceServerException, match="exists as a counter"):
            client.load_model("clash")  # the family's name is taken by another kind

        client.unload_model("counted")  # the model's process ends: its metrics go with it
        text = _scrape(worker)
        assert "requests_seen" not in text and "input_value" not in text
        client.load_model("clash")  # the name is free again
        assert client.is_model_ready("clash")


DELETES = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Each request makes a metric with a label of its value and drops it; the last one made
    is kept. Dropped metrics leave the scrape (their deletion goes with the call's answer)."""

    def initialize(self, args):
        self.family = pb_utils.MetricFamily("kept_or_not", "Series made per request",
                                            pb_utils.MetricFamily.GAUGE)
        self.kept = None

    def execute(self, requests):
        out = []
        for request in requests:
            value = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            metric = self.family.Metric(labels={"n": str(value)})
            metric.set(value)
            self.kept = metric  # the previous one is deleted here
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                "OUT", np.array([value], dtype=np.float64))]))
        return out
'''


def test_a_dropped_metric_leaves_the_scrape(tmp_path):
    python_models(tmp_path, {"deletes": DELETES},
                  'max_batch_size: 0\n'
                  'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
                  'output [ { name: "OUT" data_type: TYPE_FP64 dims: [ 1 ] } ]\n')
    served = start_worker(tmp_path)
    try:
        with httpclient.InferenceServerClient(served.http) as client:
            for value in (1, 2, 3):
                tensor = httpclient.InferInput("IN", [1], "FP32")
                tensor.set_data_from_numpy(np.array([value], dtype=np.float32))
                client.infer("deletes", [tensor])
        text = _scrape(served)
    finally:
        served.stop()
    assert 'kept_or_not{n="3"} 3\n' in text
    assert 'kept_or_not{n="1"}' not in text and 'kept_or_not{n="2"}' not in text


ECHO = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]) for r in requests]
'''

BACKGROUND = '''
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """A thread of its own, well after initialize() returned and with no request ever sent,
    makes metrics, reads one back, calls another model and asks whether it is ready."""

    def initialize(self, args):
        self.kept = []
        threading.Thread(target=self.work, daemon=True).start()

    def work(self):
        time.sleep(0.5)
        family = pb_utils.MetricFamily("between_calls", "Set by a thread of the model's",
                                       pb_utils.MetricFamily.GAUGE)
        first = family.Metric(labels={"step": "set"})
        first.set(7)
        read = family.Metric(labels={"step": "read"})
        read.set(first.value() + 1)
        deadline = time.monotonic() + 60  # the worker loads "echo" beside this model
        while not pb_utils.is_model_ready("echo") and time.monotonic() < deadline:
            time.sleep(0.05)
        request = pb_utils.InferenceRequest(
            model_name="echo", requested_output_names=["OUT"],
            inputs=[pb_utils.Tensor("IN", np.array([41], dtype=np.float32))])
        response = request.exec()
        bls = family.Metric(labels={"step": "bls"})
        if response.has_error():
            bls.set(-1)
        else:
            bls.set(float(pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()[0]) + 1)
        answer = float(pb_utils.is_model_ready("echo"))
        ready = family.Metric(labels={"step": "ready"})  # made at 0, then set: the test waits
        ready.set(answer)
        self.kept = [family, first, read, bls, ready]

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]) for r in requests]
'''


def test_a_model_thread_talks_to_the_worker_between_calls(tmp_path):
    """The worker read a model's channel (not decoupled) only while one of its calls ran: a
    metric made by the model's own thread between calls waited 30 s and failed, its updates
    reached the scrape only with the next request, and a BLS call waited for one."""
    python_models(tmp_path, {"echo": ECHO, "background": BACKGROUND},
                  'max_batch_size: 0\n'
                  'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
                  'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]\n')
    served = start_worker(tmp_path)
    try:
        deadline = time.monotonic() + 75
        text = _scrape(served)
        # for the last value, not the series: a scrape may fall between its making and its set
        while 'between_calls{step="ready"} 1\n' not in text and time.monotonic() < deadline:
            time.sleep(0.1)
            text = _scrape(served)
    finally:
        served.stop()
    assert 'between_calls{step="set"} 7\n' in text
    assert 'between_calls{step="read"} 8\n' in text
    assert 'between_calls{step="bls"} 42\n' in text
    assert 'between_calls{step="ready"} 1\n' in text


DROPS_BETWEEN_CALLS = '''
import gc
import threading
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """A thread of its own makes a series, then drops it and sends nothing more; no request is
    ever sent."""

    def initialize(self, args):
        threading.Thread(target=self.work, daemon=True).start()

    def work(self):
        self.family = pb_utils.MetricFamily("dropped_between_calls", "x",
                                            pb_utils.MetricFamily.GAUGE)
        first = self.family.Metric(labels={"n": "first"})
        first.set(1)
        time.sleep(1.0)
        del first
        gc.collect()

    def execute(self, requests):
        return []
'''


def test_a_metric_dropped_between_calls_leaves_the_scrape(tmp_path):
    """A deletion from __del__ waited for the channel's next message: dropped by a model's own
    thread between calls, the series stayed on the scrape until the model sent anything else."""
    python_models(tmp_path, {"drops": DROPS_BETWEEN_CALLS},
                  'max_batch_size: 0\n'
                  'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
                  'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]\n')
    served = start_worker(tmp_path)
    try:
        seen = False
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            there = 'dropped_between_calls{n="first"} 1' in _scrape(served)
            seen = seen or there
            if seen and not there:
                break
            time.sleep(0.05)
    finally:
        served.stop()
    assert seen and not there
