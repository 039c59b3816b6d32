"""The load generator's sequences for sequence_batching models (perf_analyzer's sequence flags):
the request templates, the ids and lengths, and `perf`/`profile` against a stateful model that
refuses any request out of its sequence's order."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from serving import start_worker
from test_ensemble import ACCUMULATE, SEQUENCE_CONFIG, _python_model
from tritonclient.grpc import service_pb2

from analyzer.errors import AnalyzerError
from analyzer.loadgen.payload import grpc_sequence_template, http_sequence_template
from analyzer.loadgen.perf import PerfOptions, run_perf
from analyzer.loadgen.sequences import SequenceOptions, SequenceSource, parse_id_range

TENSORS = {"INPUT": np.array([[7]], dtype=np.int32)}
# ACCUMULATE that also refuses a START for a sequence it has not seen END: with ids reused
# (a short --sequence-id-range) it checks that every sequence was ended
STRICT = ACCUMULATE.replace(
    """            if get("START").reshape(-1)[0]:
                self.sums[corrid] = 0""",
    """            if get("START").reshape(-1)[0]:
                if corrid in self.sums:
                    out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                        f"sequence {corrid} started again before its END")))
                    continue
                self.sums[corrid] = 0""",
)
assert STRICT != ACCUMULATE
TYPES = {"INPUT": "INT32"}


def test_the_http_template_carries_the_sequence_parameters():
    template = http_sequence_template("h:1", "accumulate", "", TENSORS, TYPES)
    raw = template.build(template.id_part(42), True, False)
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v2/models/accumulate/infer HTTP/1.1"
    fields = dict(line.split(": ", 1) for line in lines[1:])
    assert int(fields["Content-Length"]) == len(body)
    size = int(fields["Inference-Header-Content-Length"])
    header = json.loads(body[:size])
    assert header["parameters"] == {"binary_data_output": True, "sequence_id": 42,
                                    "sequence_start": True, "sequence_end": False}  # fmt: skip
    assert body[size:] == np.array([7], dtype=np.int32).tobytes()


def test_the_grpc_template_is_a_model_infer_request_with_the_sequence_parameters():
    template = grpc_sequence_template("accumulate", "1", TENSORS, TYPES)
    raw = template.build(template.id_part(2**40), False, True)
    assert raw[0] == 0 and int.from_bytes(raw[1:5], "big") == len(raw) - 5  # gRPC's prefix
    request = service_pb2.ModelInferRequest.FromString(raw[5:])
    assert (request.model_name, request.model_version) == ("accumulate", "1")
    assert request.parameters["sequence_id"].int64_param == 2**40
    assert request.parameters["sequence_start"].bool_param is False
    assert request.parameters["sequence_end"].bool_param is True
    assert request.raw_input_contents == [np.array([7], dtype=np.int32).tobytes()]
    # the parameters come before the raw contents: the worker keeps the layout up to them
    assert raw.index(b"sequence_id") < raw.index(np.array([7], dtype=np.int32).tobytes())


def test_sequence_ids_are_each_shards_own_and_wrap_inside_the_range():
    template = http_sequence_template("h:1", "m", "", TENSORS, TYPES)
    unbounded = SequenceOptions(id_start=5)
    a, b = SequenceSource(unbounded, 0, 2, 0), SequenceSource(unbounded, 1, 2, 0)
    ids_a = [a.new(template).id for _ in range(50)]
    ids_b = [b.new(template).id for _ in range(50)]
    assert len(set(ids_a + ids_b)) == 100 and min(ids_a + ids_b) == 5
    bounded = SequenceOptions(id_start=10, id_end=17)  # 7 ids over 2 shards: 6 used, 3 each
    c, d = SequenceSource(bounded, 0, 2, 0), SequenceSource(bounded, 1, 2, 0)
    ids_c, ids_d, sc, sd = set(), set(), None, None
    for _ in range(20):  # each sequence over before the next (one concurrency slot)
        sc, sd = c.new(template, sc), d.new(template, sd)
        ids_c.add(sc.id)
        ids_d.add(sd.id)
    assert ids_c == {10, 12, 14} and ids_d == {11, 13, 15}


def test_an_id_still_held_by_a_live_sequence_is_skipped():
    """Two slots whose sequences end at different times: round robin alone would hand slot B
    the id slot A is still using."""
    template = http_sequence_template("h:1", "m", "", TENSORS, TYPES)
    source = SequenceSource(SequenceOptions(id_start=1, id_end=4), 0, 1, 0)  # ids 1, 2, 3
    a, b = source.new(template), source.new(template)  # 1 and 2
    b = source.new(template, b)  # b ended first: 3
    b = source.new(template, b)  # next in turn is 1, held by a: 2
    assert (a.id, b.id) == (1, 2)
    c = source.new(template)  # 1 and 2 live: 3
    assert c.id == 3
    with pytest.raises(AnalyzerError, match="every id of this client process is held"):
        source.new(template)
    source.forget()  # the load changed: nothing is live any more
    assert source.new(template).id in {1, 2, 3}


def test_sequence_lengths_vary_within_the_variation():
    template = http_sequence_template("h:1", "m", "", TENSORS, TYPES)
    source = SequenceSource(SequenceOptions(length=20, variation_pct=20), 0, 1, 3)
    lengths = [source.new(template).left for _ in range(400)]
    assert min(lengths) >= 16 and max(lengths) <= 24 and len(set(lengths)) > 4
    fixed = SequenceSource(SequenceOptions(length=3, variation_pct=0), 0, 1, 3)
    sequence = fixed.new(template)
    assert [sequence.flags() for _ in range(3)] == [(True, False), (False, False), (False, True)]
    assert sequence.done


def test_sequence_flags_that_cannot_work_are_one_sentence():
    with pytest.raises(AnalyzerError, match="--sequence-id-range '5:5'"):
        parse_id_range("5:5")
    with pytest.raises(AnalyzerError, match="too few for 8 live sequences"):
        SequenceOptions(id_start=1, id_end=5).check(8)
    with pytest.raises(AnalyzerError, match="--sequence-length 0"):
        SequenceOptions(length=0).check(1)


@pytest.fixture(scope="module")
def accumulate_worker(tmp_path_factory):
    repo = tmp_path_factory.mktemp("sequences")
    _python_model(repo, "accumulate", STRICT, SEQUENCE_CONFIG.replace("STRATEGY", "direct { }"))
    served = start_worker(repo)
    yield served
    assert served.stop() == 0, "".join(served.output)


def _perf(served, protocol: str, **kwargs) -> list:
    from analyzer.loadgen.measure import MeasureSettings

    url = served.grpc if protocol == "grpc" else served.http
    settings = MeasureSettings(mode="time_windows", window_ms=400, stability_pct=100, max_trials=2)
    options = PerfOptions(model="accumulate", url=url, protocol=protocol, settings=settings,
                          client_processes=1, **kwargs)  # fmt: skip
    return list(run_perf(options))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_drives_sequences_in_concurrency_mode(accumulate_worker, protocol):
    """Each slot runs its sequences in order; the worker refuses any request continuing a
    sequence it never saw start, or one already ended, and the model itself fails a request
    whose START it did not see: no errors means every sequence went START ... END."""
    points = _perf(accumulate_worker, protocol, concurrency=[1, 4],
                   sequence=SequenceOptions(length=5, variation_pct=40))  # fmt: skip
    assert [p.error_count for p in points] == [0, 0], [p.errors for p in points]
    assert all(p.request_count > 10 for p in points)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_every_sequence_ends_before_its_id_comes_again(accumulate_worker, protocol):
    """Eight ids for four slots: each id is used again within the point, and the model refuses
    a START for a sequence whose END it did not see."""
    points = _perf(accumulate_worker, protocol, concurrency=[4],
                   sequence=SequenceOptions(length=3, variation_pct=0, id_start=1, id_end=9))
    assert points[0].error_count == 0, points[0].errors
    assert points[0].request_count > 3 * 8  # the ids went round more than once


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_sequences_through_system_shared_memory(accumulate_worker, protocol):
    """perf_analyzer's --shared-memory system with a sequence model: every step names the
    registered regions and carries its own sequence parameters."""
    points = _perf(accumulate_worker, protocol, concurrency=[4], shared_memory="system",
                   sequence=SequenceOptions(length=4, variation_pct=0, id_start=1, id_end=9))
    assert points[0].error_count == 0, points[0].errors
    assert points[0].request_count > 3 * 8


def test_the_shared_memory_templates_name_the_regions_and_carry_no_tensor_bytes():
    from analyzer.loadgen.shm import Placed

    placed = {"INPUT": Placed("in0", 0, 4)}
    outputs = {"OUTPUT": Placed("out", 0, 64)}
    http = http_sequence_template("h:1", "m", "", TENSORS, TYPES, placed=placed,
                                  outputs=outputs)  # fmt: skip
    _, _, body = http.build(http.id_part(7), False, True).partition(b"\r\n\r\n")
    header = json.loads(body)
    assert header["inputs"][0]["parameters"]["shared_memory_region"] == "in0"
    assert header["outputs"][0]["parameters"]["shared_memory_region"] == "out"
    assert header["parameters"] == {"sequence_id": 7, "sequence_start": False,
                                    "sequence_end": True}  # fmt: skip
    grpc = grpc_sequence_template("m", "", TENSORS, TYPES, placed=placed, outputs=outputs)
    request = service_pb2.ModelInferRequest.FromString(grpc.build(grpc.id_part(7), True, False)[5:])
    assert not request.raw_input_contents
    assert request.inputs[0].parameters["shared_memory_region"].string_param == "in0"
    assert request.outputs[0].parameters["shared_memory_byte_size"].int64_param == 64
    assert request.parameters["sequence_start"].bool_param is True


def test_perf_drives_serial_sequences_at_a_request_rate(accumulate_worker):
    points = _perf(accumulate_worker, "http", request_rates=[200.0],
                   sequence=SequenceOptions(length=4, count=3, serial=True))  # fmt: skip
    assert points[0].error_count == 0, points[0].errors
    assert points[0].request_count > 20


def test_perf_command_takes_perf_analyzers_sequence_flags(accumulate_worker):
    run = subprocess.run(
        [sys.executable, "-m", "analyzer", "perf", "-m", "accumulate", "-u",
         accumulate_worker.grpc, "-i", "grpc", "--concurrency-range", "2",
         "--sequence-length", "3", "--sequence-id-range", "100:200", "-p", "300",
         "--measurement-mode", "time_windows", "-r", "2", "-s", "100"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "error" not in run.stdout.lower(), run.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "analyzer", "perf", "-m", "accumulate", "-u",
         accumulate_worker.grpc, "--sequence-id-range", "9:3"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2
    assert "--sequence-id-range '9:3' must be start[:end]" in bad.stderr


def test_a_sequence_model_is_profiled_without_a_dynamic_batcher(tmp_path: Path):
    repo = tmp_path / "repo"
    _python_model(repo, "accumulate", ACCUMULATE, SEQUENCE_CONFIG.replace("STRATEGY", "direct { }"))
    (tmp_path / "cfg.yaml").write_text(
        "perf_analyzer_flags:\n  sequence-length: 4\n  sequence-id-range: '1000'\n")
    run = subprocess.run(
        [sys.executable, "-m", "analyzer", "profile", "-f", "cfg.yaml",
         "--model-repository", str(repo), "--profile-models", "accumulate",
         "--output-model-repository-path", "OUT", "--export-path", "EXP",
         "--run-config-search-mode", "quick", "--run-config-search-max-instance-count", "2",
         "--run-config-search-max-model-batch-size", "4",
         "--run-config-search-max-concurrency", "4", "--final-rounds", "0",
         "--measurement-mode", "time_windows", "--measurement-interval", "300",
         "--stability-percentage", "100", "--max-trials", "2"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = json.loads((tmp_path / "EXP" / "results" / "profile_results.json").read_text())
    text = json.dumps(results)
    assert '"accumulate"' in text
    configs = list((tmp_path / "OUT").glob("accumulate*/config.pbtxt"))
    assert configs
    for config in configs:
        body = config.read_text()
        assert "sequence_batching" in body and "dynamic_batching" not in body, body
