"""The pure parts of `profile`: settings, search order and early stops, variants, ranking."""

from __future__ import annotations

import dataclasses
import math
import re
import threading
import time
from pathlib import Path

import pytest

from analyzer.config.model_config import load_model_config, parse_model_config
from analyzer.config.profile_config import ProfileConfigError, load_profile_config
from analyzer.repository.variants import VariantError, default_variant, make_variant, write_variant
from analyzer.results.measurement import Measurement
from analyzer.results.ranking import ConfigResult, Ranker
from analyzer.search.base import Outcome, SearchPoint
from analyzer.search.brute import BruteSearch, SearchLimits, expand_manual
from analyzer.search.space import SearchSpaceError, load_search_space

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "model_repository"
SEED = (
    "--model-repository {repo} --profile-models add_sub --triton-launch-mode=local "
    "--output-model-repository-path OUT --export-path EXP --override-output-model-repository "
    "--run-config-search-max-concurrency 2 --run-config-search-max-model-batch-size 2 "
    "--run-config-search-max-instance-count 2"
)


def test_seed_command_parses(tmp_path):
    config = load_profile_config(SEED.format(repo=EXAMPLES).split(), cwd=tmp_path)
    assert [m.name for m in config.models] == ["add_sub"]
    assert config.override_output_model_repository is True
    assert config.triton_launch_mode == "local"
    assert config.run_config_search_max_concurrency == 2
    assert config.output_repository == tmp_path / "OUT"
    assert config.checkpoints == tmp_path / "EXP" / "checkpoints"
    assert config.objectives == {"perf_throughput": 10.0}
    assert config.run_config_search_max_instance_count == 2
    assert config.client_protocol == "grpc"  # MA's default


def test_yaml_then_command_line(tmp_path):
    (tmp_path / "c.yaml").write_text(
        f"model_repository: {EXAMPLES}\n"
        "profile_models:\n"
        "  tiny_cnn:\n"
        "    parameters: {concurrency: [1, 4], batch_sizes: 2}\n"
        "    constraints: {perf_latency_p99: {max: 20}}\n"
        "    perf_analyzer_flags: {measurement-interval: 500}\n"
        "  add_sub: {}\n"
        "run_config_search_max_concurrency: 64\n"
        "latency_budget: 50\n"
        "objectives: {perf_throughput: 10, perf_latency_p99: 5}\n"
        "perf_analyzer_path: /usr/bin/perf_analyzer\n"
    )
    config = load_profile_config(
        ["-f", str(tmp_path / "c.yaml"), "--run-config-search-max-concurrency", "8"], cwd=tmp_path
    )
    assert config.run_config_search_max_concurrency == 8  # the command line wins
    tiny, add_sub = config.models
    assert tiny.concurrency == [1, 4] and tiny.batch_sizes == [2]
    # MA 1.58 applies latency_budget over a model's own constraints (its parser gives 50 here)
    assert tiny.constraints == {"perf_latency_p99": {"max": 50.0}}
    assert add_sub.constraints == {"perf_latency_p99": {"max": 50.0}}  # latency_budget
    assert add_sub.objectives == {"perf_throughput": 10.0, "perf_latency_p99": 5.0}
    assert tiny.perf_analyzer_flags == {"measurement-interval": 500}
    assert any("perf_analyzer_path" in note for note in config.notes)


def test_ma_flags_that_mean_nothing_here_are_accepted_with_a_note(tmp_path):
    config = load_profile_config(
        ["-m", str(EXAMPLES), "--profile-models", "add_sub", "--collect-cpu-metrics",
         "--skip-detailed-reports", "--triton-output-path", "LOG", "--perf-analyzer-path",
         "perf_analyzer", "-d", "30", "-r", "3", "--dcgm-disable=false"], cwd=tmp_path)  # fmt: skip
    said = " ".join(config.notes)
    for key in ("collect_cpu_metrics", "perf_analyzer_path", "dcgm_disable"):
        assert f"'{key}' has no effect here" in said, key
    assert "collect_cpu_metrics" not in config.values  # a note, never a setting
    assert config.skip_detailed_reports and not config.skip_summary_reports  # MA's meaning
    assert config.triton_output_path == str(tmp_path / "LOG")
    assert config.duration_seconds == 30  # MA's -d: the idle server's metrics, in seconds
    assert config.client_max_retries == 3  # MA's -r: the worker's readiness checks


def test_an_unknown_output_field_is_noted_when_the_settings_are_read(tmp_path):
    """Not after the whole run: the note comes first, and the CSV is written without it."""
    from analyzer.metrics import OUTPUT_FIELDS
    from analyzer.report.exports import COLUMNS, GPU_HEADERS, _known

    config = load_profile_config(
        ["-m", str(EXAMPLES), "--profile-models", "add_sub", "--inference-output-fields",
         "model_name,perf_throughput,perf_speed", "--gpu-output-fields",
         "gpu_uuid,gpu_used_memory"], cwd=tmp_path)  # fmt: skip
    said = [n for n in config.notes if "output_fields" in n]
    assert len(said) == 1 and said[0].startswith(
        "command line: 'inference_output_fields' names 'perf_speed', which is not a column of "
        "that table; it is left out (known: ")  # fmt: skip
    fields = _known(list(config.inference_output_fields), "inference_output_fields")
    assert fields == ["model_name", "perf_throughput"]
    # the tables' own columns are what the settings check against
    assert set(COLUMNS) == OUTPUT_FIELDS["inference_output_fields"]
    assert set(GPU_HEADERS) == OUTPUT_FIELDS["gpu_output_fields"]


@pytest.mark.parametrize(
    ("yaml_text", "argv", "needle"),
    [
        ("profile_modles: [a]\n", [], "key 'profile_modles' is not a profile setting"),
        ("profile_models: [a]\nrun_config_search_max_concurrency: lots\n", [],
         "'run_config_search_max_concurrency' is 'lots'"),
        ("profile_models: [a]\nobjectives: {perf_speed: 1}\n", [], "objective 'perf_speed'"),
        ("profile_models: [a]\nconstraints: {perf_latency_p99: 5}\n", [],
         "constraint 'perf_latency_p99' is 5"),
        ("profile_models: {a: {paramters: {}}}\n", [], "key 'paramters' is unknown"),
        ("profile_models: [a]\n", ["--triton-launch-mode", "kubernetes"],
         "'triton_launch_mode' is 'kubernetes'"),
        ("profile_models: [a]\n", ["--run-config-search-min-concurrency", "8",
                                   "--run-config-search-max-concurrency", "2"],
         "run_config_search_min_concurrency (8)"),
        ("profile_models: [a]\n", ["--batch-sizes", "1,x"], "'batch_sizes' has 'x'"),
        ("profile_models: [a]\n", ["--no-such-flag", "1"], "unrecognized arguments"),
        ("a: [1\n", [], "is not valid YAML at line"),
        ("profile_models: [a]\nconcurrency: [1]\nbatch_sizes: [1]\nconcurrency: [8]\n", [],
         "is not valid YAML at line 5: key 'concurrency' is given twice (first at line 3)"),
        ("profile_models: {a: {parameters: {concurrency: [1], concurrency: [2]}}}\n", [],
         "is not valid YAML at line 2: key 'concurrency' is given twice (first at line 2)"),
        ("a: caf\xe9\n", [], "c.yaml, line 2: is not UTF-8 text (byte 0xe9 at offset"),
        # a CSV's name once overwrote whatever path it named, and two equal names lost a CSV
        ("profile_models: [a]\n", ["--filename-server-only", "/tmp/a/config.pbtxt"],
         "'filename_server_only' is '/tmp/a/config.pbtxt'; expected a plain file name"),
        ("profile_models: [a]\nfilename_model_gpu: ''\n", [],
         "'filename_model_gpu' is ''; expected a plain file name"),
        ("profile_models: [a]\n", ["--filename-model-gpu", "metrics-model-inference.csv"],
         "the name of 'filename_model_inference' too"),
        ("profile_models: [a]\n", ["--filename-server-only", "profile_results.json"],
         "the name of the results file too"),
        ("profile_models: [a]\n", ["--monitoring-interval", "inf"],
         "'monitoring_interval' is 'inf'; expected a finite number"),
        ("profile_models: [a]\nconstraints: {perf_latency_p99: {max: .nan}}\n", [],
         "constraint 'perf_latency_p99.max' is nan; expected a finite number"),
        ("profile_models: [a]\nconstraints: {perf_throughput: {min: 10, max: 1}}\n", [],
         "constraint 'perf_throughput' has min 10 over max 1"),
        ("profile_models: [a]\nobjectives: {perf_throughput: .inf}\n", [],
         "objective 'perf_throughput' has weight inf; expected a number > 0"),
        ("profile_models: [a]\nconcurrency: {start: 1, stop: 1000000000000}\n", [],
         "has 1,000,000,000,000 values; at most 10,000"),
        ("profile_models: [a]\nconcurrency: {start: 0, stop: 2}\n", [],
         "'concurrency' range starts at 0; values must be > 0"),
        ("profile_models: {a: {model_config_parameters: {max_batch_size: [4, abc]}}}\n", [],
         "profile_models.a.model_config_parameters.max_batch_size has 'abc'; expected whole"),
        ("profile_models: {a: {model_config_parameters: {max_batch_sizes: [1, 4]}}}\n", [],
         "profile_models.a.model_config_parameters: 'max_batch_sizes' is not a field of "
         "ModelConfig (did you mean 'max_batch_size'?)"),
        ("profile_models: {a: {model_config_parameters: {instance_group: [{kind: KIND_BOGUS, "
         "count: [1, 2]}]}}}\n", [],
         "profile_models.a.model_config_parameters.instance_group = [{'kind': 'KIND_BOGUS', "
         "'count': 1}]: Failed to parse"),
        ("profile_models: {a: {model_config_parameters: {dynamic_batching: "
         "{max_queue_delay_microsecond: [100]}}}}\n", [],
         "model_config_parameters.dynamic_batching: 'max_queue_delay_microsecond' is not a "
         "field of ModelDynamicBatching"),
        ("profile_models: [a]\n", ["-c", "1", "--request-rate", "10"],
         "profile_models.a: both concurrency [1] and request_rate [10] are given; a model's "
         "load is one of them"),
        ("profile_models: {a: {parameters: {request_rate: [5]}}}\nconcurrency: [2]\n", [],
         "both concurrency [2] and request_rate [5] are given"),
        ("profile_models: [null]\n", [], "'profile_models' has None; expected model names"),
        ("profile_models: [[a]]\n", [], "'profile_models' has ['a']; expected model names"),
        ("profile_models: [a]\n", ["--optuna-min-trials", "50", "--optuna-max-trials", "5"],
         "'optuna_min_trials' (50) is more than 'optuna_max_trials' (5)"),
        ("profile_models: [a]\n", ["--server-startup-timeout", "0"],
         "'server_startup_timeout' is 0.0; expected seconds > 0"),
        ("profile_models: [a]\ntriton_server_flags: [1]\n", [],
         "triton_server_flags is [1]; expected a mapping of server flag names to values"),
    ],
)  # fmt: skip
def test_bad_settings_name_the_key(tmp_path, yaml_text, argv, needle):
    (tmp_path / "c.yaml").write_bytes(  # latin-1: a test writes a byte that is not UTF-8
        f"model_repository: {EXAMPLES}\n".encode() + yaml_text.encode("latin-1"))
    with pytest.raises(ProfileConfigError) as err:
        load_profile_config(["-f", str(tmp_path / "c.yaml"), *argv], cwd=tmp_path)
    assert needle in str(err.value)


def _walk(search, throughput):
    trials = []
    while (trial := search.ask()) is not None:
        trials.append(trial)
        search.tell(trial, Outcome(ok=True, throughput=throughput(trial)))
    return trials


def test_brute_order_for_the_seed_caps():
    limits = SearchLimits(own_max_batch_size=8, max_model_batch_size=2, max_instance_count=2,
                          max_concurrency=2)  # fmt: skip
    trials = _walk(BruteSearch(load_search_space(), limits), lambda t: 100.0 + t.value)
    configs = list(dict.fromkeys(t.params_json for t in trials))
    assert trials[0].params == {} and len(trials) == 2 * len(configs)
    # default + per instance count: mbs 1 (one delay) + mbs 2 x 3 delays
    assert len(configs) == 1 + 2 * (1 + 3)
    assert {t.value for t in trials} == {1, 2}


def test_max_batch_size_doubling_stops_when_not_better():
    limits = SearchLimits(own_max_batch_size=64, max_model_batch_size=64, max_instance_count=1,
                          concurrency=[4])  # fmt: skip
    # throughput grows to mbs 4 then falls: 8 is measured, 16 is not
    trials = _walk(BruteSearch(load_search_space(), limits),
                   lambda t: {1: 10, 2: 20, 4: 40, 8: 30}.get(t.params.get("max_batch_size"), 5))
    sizes = {t.params.get("max_batch_size") for t in trials if t.params}
    assert sizes == {1, 2, 4, 8}


def test_concurrency_plateau_rule_and_client_batch_cap():
    limits = SearchLimits(own_max_batch_size=4, max_model_batch_size=1, max_instance_count=1,
                          max_concurrency=1024, batch_sizes=[1, 8])  # fmt: skip
    trials = _walk(BruteSearch(load_search_space(), limits),
                   lambda t: min(t.value, 8) * 100.0)  # saturates at concurrency 8
    default = [t for t in trials if not t.params]
    assert [t.value for t in default] == [1, 2, 4, 8, 16, 32, 64]  # 8..64 gain < 5%: stop
    assert all(t.batch_size == 1 for t in trials)  # batch 8 > max_batch_size 4 (and 1)


def test_failed_variant_stops_its_sweep():
    limits = SearchLimits(own_max_batch_size=0, max_instance_count=2, max_concurrency=8)
    search = BruteSearch(load_search_space(), limits)
    asked = []
    while (trial := search.ask()) is not None:
        asked.append(trial)
        search.tell(trial, Outcome(ok=trial.params.get("instance_count") != 1, throughput=50.0))
    failed = [t for t in asked if t.params.get("instance_count") == 1]
    assert len(failed) == 1
    assert {t.params.get("instance_count") for t in asked} == {None, 1, 2}


def test_manual_model_config_parameters_expand():
    options = expand_manual({
        "max_batch_size": [4, 8],
        "dynamic_batching": {"max_queue_delay_microseconds": [100, 200]},
        "instance_group": [{"kind": "KIND_CPU", "count": [1, 2]}],
    })  # fmt: skip
    assert len(options) == 8
    assert {"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": 200},
            "instance_group": [{"kind": "KIND_CPU", "count": 2}]} in options  # fmt: skip
    # instance_group as a list of lists: each inner list is one whole value, whose counts are
    # choices too (MA's normalised form; every combination failed to parse before)
    nested = expand_manual({"instance_group": [[{"kind": "KIND_CPU", "count": [1, 2]}],
                                               [{"kind": "KIND_GPU", "count": 1}]]})  # fmt: skip
    assert nested == [{"instance_group": [{"kind": "KIND_CPU", "count": 1}]},
                      {"instance_group": [{"kind": "KIND_CPU", "count": 2}]},
                      {"instance_group": [{"kind": "KIND_GPU", "count": 1}]}]  # fmt: skip
    assert expand_manual({"dynamic_batching": {"preferred_batch_size": [[2, 4], [8]]}}) == [
        {"dynamic_batching": {"preferred_batch_size": [2, 4]}},
        {"dynamic_batching": {"preferred_batch_size": [8]}}]


def test_model_config_parameters_in_mas_forms_are_accepted(tmp_path):
    """The check of every choice against Triton's schema passes what MA's documentation
    writes: lists of choices, nested messages, instance_group as a list of lists, maps."""
    (tmp_path / "c.yaml").write_text(
        f"model_repository: {EXAMPLES}\n"
        "profile_models:\n"
        "  add_sub:\n"
        "    model_config_parameters:\n"
        "      max_batch_size: [2, 4, 8]\n"
        "      dynamic_batching: {max_queue_delay_microseconds: [200, 400], "
        "preferred_batch_size: [[2, 4]]}\n"
        "      instance_group: [[{kind: KIND_CPU, count: [1, 2]}]]\n"
        "      parameters: {EXECUTION_ENV_PATH: {string_value: x}}\n"
        "      model_warmup: [{name: w, batch_size: 1, inputs: {INPUT0: {data_type: TYPE_FP32, "
        "dims: [[4]], zero_data: true}}}]\n")  # fmt: skip
    config = load_profile_config(["-f", str(tmp_path / "c.yaml")], cwd=tmp_path)
    assert config.models[0].model_config_parameters["max_batch_size"] == [2, 4, 8]


def test_yaml_merge_keys_may_repeat_what_they_merge():
    """A repeated key is an error, but `<<: *defaults` followed by an override is YAML's own way
    to write a variant of a mapping and stays allowed."""
    from analyzer.config.yaml_file import load_user_yaml

    text = "base: &b {concurrency: [1], batch_sizes: [1]}\nmine:\n  <<: *b\n  concurrency: [4]\n"
    assert load_user_yaml(text)["mine"] == {"concurrency": [4], "batch_sizes": [1]}


def test_search_space_file_errors(tmp_path):
    bad = tmp_path / "space.yaml"
    bad.write_text("dynamic_batching: {max_queue_delay_microseconds: [-5]}\n")
    with pytest.raises(SearchSpaceError, match="max_queue_delay_microseconds"):
        load_search_space(bad)
    bad.write_text("concurrency: {scale: cubic}\n")
    with pytest.raises(SearchSpaceError, match="concurrency.scale"):
        load_search_space(bad)
    bad.write_text("concurrency: {scale: linear}\nconcurrency: {scale: doubling}\n")
    with pytest.raises(SearchSpaceError, match="at line 2: key 'concurrency' is given twice"):
        load_search_space(bad)


def test_variants_are_made_from_the_message(tmp_path):
    base = load_model_config(EXAMPLES / "add_sub" / "config.pbtxt")
    variant = make_variant(base, {"instance_count": 2, "max_batch_size": 4,
                                  "max_queue_delay_microseconds": 200}, cpu_only=True)  # fmt: skip
    assert variant.max_batch_size == 4
    assert [(g.count, g.kind) for g in variant.instance_group] == [(2, 2)]  # KIND_CPU
    assert variant.dynamic_batching.max_queue_delay_microseconds == 200
    assert base.max_batch_size == 8  # the original is untouched
    manual = make_variant(base, {"dynamic_batching": {"preferred_batch_size": [2, 4]}}, True)
    assert list(manual.dynamic_batching.preferred_batch_size) == [2, 4]
    with pytest.raises(VariantError, match="preferred_batch_size 4 is larger"):
        make_variant(manual, {"max_batch_size": 2}, True)
    with pytest.raises(VariantError, match="'colour' is not a field"):
        make_variant(base, {"colour": "red"}, True)
    write_variant(EXAMPLES / "add_sub", variant, tmp_path / "add_sub_config_0")
    written = load_model_config(tmp_path / "add_sub_config_0" / "config.pbtxt")
    assert written.name == "add_sub_config_0" and written.max_batch_size == 4
    assert (tmp_path / "add_sub_config_0" / "1" / "model.py").exists()


def test_gpu_instances_become_cpu_without_a_gpu():
    config = parse_model_config(
        'name: "m" backend: "python" instance_group [ { kind: KIND_GPU count: 2 gpus: [0] } ]'
    )
    fixed = default_variant(config, cpu_only=True)
    assert [(g.count, g.kind, list(g.gpus)) for g in fixed.instance_group] == [(2, 2, [])]


def _m(name, throughput, p99):
    return Measurement("m", name, "concurrency", 1, 1,
                       {"perf_throughput": throughput, "perf_latency_p99": p99})  # fmt: skip


def test_ranking_honours_constraints_and_weights():
    fast_slow = ConfigResult("m", "m_config_0", {}, {}, "", "", measurements=[_m("a", 900, 80)])
    ok = ConfigResult("m", "m_config_1", {}, {}, "", "",
                      measurements=[_m("b", 500, 9), _m("b", 700, 30)])  # fmt: skip
    failed = ConfigResult("m", "m_config_2", {}, {}, "", "", error="load failed")
    ranker = Ranker({"perf_throughput": 1}, {"perf_latency_p99": {"max": 40}})
    ranked = ranker.rank([fast_slow, ok, failed])
    assert [r.name for r in ranked] == ["m_config_1", "m_config_0", "m_config_2"]
    assert ok.best.metrics["perf_throughput"] == 700 and ok.satisfies
    assert not fast_slow.satisfies and "perf_latency_p99 80 ms > max 40" in fast_slow.violations[0]
    # with latency weighted in, the 9 ms point wins inside config 1
    Ranker({"perf_throughput": 1, "perf_latency_p99": 1}, {}).rank([ok])
    assert ok.best.metrics["perf_latency_p99"] == 9


def test_checkpoint_survives_a_torn_last_line(tmp_path):
    from analyzer.results.checkpoint import Checkpoint, point_key

    store = Checkpoint(tmp_path)
    key = point_key("cfg", "concurrency", 4, 1, "s")
    store.record_point(key, _m("m_config_0", 100, 2))
    store.record_failure("k2", "failed to load")
    with store.path.open("a") as f:
        f.write('{"type": "point", "key": "torn", "measurem')  # SIGKILL mid-write
    again = Checkpoint(tmp_path)
    assert again.resumed and set(again.points) == {key}
    assert again.points[key].metrics["perf_throughput"] == 100
    assert again.failures == {"k2": "failed to load"}
    again.record_point("k3", _m("m_config_1", 50, 3))  # appends after the torn line stay readable
    assert set(Checkpoint(tmp_path).points) == {key, "k3"}


@pytest.mark.parametrize("line", ["[1, 2]", '{"type": "point", "key": "x", "measurement": 5}',
                                  '{"type": "failure"}'])
def test_a_checkpoint_line_that_is_not_a_record_is_named_not_a_traceback(tmp_path, line):
    from analyzer.results.checkpoint import Checkpoint, CheckpointError

    store = Checkpoint(tmp_path)
    store.record_failure("k", "failed to load")
    with store.path.open("a") as f:
        f.write(line + "\n")
    with pytest.raises(CheckpointError, match=r"profile\.ckpt\.jsonl', line 2: is not a "
                       "checkpoint record; move the file away"):
        Checkpoint(tmp_path)
    store.path.unlink()
    store.path.mkdir()
    with pytest.raises(CheckpointError, match="is not a file"):
        Checkpoint(tmp_path)


def _synthetic(trial):
    """A model whose capacity grows with instances (to 2 cores), batch size and a 200 us delay;
    throughput approaches it as concurrency grows."""
    p = trial.params
    inst = p.get("instance_count", 1)
    mbs = p.get("max_batch_size", 8)
    delay = p.get("max_queue_delay_microseconds", 0)
    capacity = 100.0 * min(inst, 2) * (1 + math.log2(mbs)) * (1.1 if delay == 200 else 1.0)
    return capacity * trial.value / (trial.value + 4.0 * mbs)


def test_quick_search_reaches_the_brute_force_best_with_fewer_points():
    from analyzer.search.quick import QuickSearch

    limits = SearchLimits(own_max_batch_size=8, max_model_batch_size=32, max_instance_count=4,
                          max_concurrency=256)  # fmt: skip
    brute = _walk(BruteSearch(load_search_space(), limits), _synthetic)
    quick = _walk(QuickSearch(load_search_space(), limits), _synthetic)
    best_brute = max(_synthetic(t) for t in brute)
    best_quick = max(_synthetic(t) for t in quick)
    assert best_quick >= 0.95 * best_brute
    assert len(quick) <= 0.5 * len(brute)
    assert len(set(quick)) == len(quick)  # nothing asked twice
    assert quick[0].params == {}  # the model's own config first
    climbed = {(t.params.get("max_queue_delay_microseconds"), t.value) for t in quick}
    assert len({d for d, _ in climbed}) > 1 and len({c for _, c in climbed}) > 3


def _flat_top(trial):
    """A flat top: at max batch 16, delay 200 us is no better than delay 0 (so a climb from
    delay 0 stops there), and 1000 us is 4% better than both; throughput saturates with load."""
    p = trial.params
    mbs = p.get("max_batch_size", 16)
    delay = p.get("max_queue_delay_microseconds", 0)
    capacity = 1000.0 * min(mbs, 16) / 16 * (1.04 if (mbs, delay) == (16, 1000) else 1.0)
    capacity *= 0.9 if p.get("instance_count", 1) > 1 else 1.0
    return capacity * min(1.0, trial.value / 8)


def test_quick_search_looks_around_a_flat_top_and_finds_the_config_two_steps_away():
    """The climb from the model's own config (mbs 16, delay 0) stops at once: delay 200 gains
    nothing. Looking around the top configs measures delay 1000 next to delay 200, and it wins.
    The final sweeps go outward from the best load, not up from concurrency 1."""
    from analyzer.search.quick import QuickSearch

    limits = SearchLimits(own_max_batch_size=32, max_model_batch_size=16, max_instance_count=2,
                          max_concurrency=16)  # fmt: skip
    search = QuickSearch(load_search_space(), limits)
    quick = _walk(search, _flat_top)
    best = max(quick, key=_flat_top)
    assert best.params == {"instance_count": 1, "max_batch_size": 16,
                           "max_queue_delay_microseconds": 1000}  # fmt: skip
    assert len(set(quick)) == len(quick)
    brute = _walk(BruteSearch(load_search_space(), limits), _flat_top)
    assert len(quick) <= 0.25 * len(brute)
    # concurrency 1 and 2 lie far below the plateau that starts at 8: no sweep goes down there
    assert not [t for t in quick if t.params_json == best.params_json and t.value < 4]


def test_quick_search_look_around_is_bounded_on_a_staircase(monkeypatch):
    """Each step along any axis gains 0.5%: never the climb's 1%, but every config looked around
    brings a better one into the top three. The look-around stops after LOOK_LIMIT looks per
    top config instead of walking the whole staircase."""
    from analyzer.search import quick

    sizes = [1, 2, 4, 8, 16, 32, 64, 128]

    def stairs(trial):
        p = trial.params
        if not p:
            return 900.0 * min(1.0, trial.value / 8)
        steps = (p["instance_count"] + sizes.index(p["max_batch_size"])
                 + [0, 200, 1000].index(p["max_queue_delay_microseconds"]))  # fmt: skip
        return 1000.0 * 1.005**steps * min(1.0, trial.value / 8)

    limits = SearchLimits(own_max_batch_size=8, max_model_batch_size=128, max_instance_count=5,
                          max_concurrency=64)  # fmt: skip

    def configs() -> int:
        trials = _walk(quick.QuickSearch(load_search_space(), limits), stairs)
        return len({t.params_json for t in trials})

    bounded = configs()
    monkeypatch.setattr(quick, "LOOK_LIMIT", 100)
    assert bounded < configs()


def test_quick_search_gain_is_scale_free():
    """Scores are logs, so the climb's 1% gain means 1% at any throughput: the same model ten
    thousand times faster is walked through the same points."""
    from analyzer.search.quick import QuickSearch

    limits = SearchLimits(own_max_batch_size=8, max_model_batch_size=32, max_instance_count=4,
                          max_concurrency=256)  # fmt: skip

    def log_score_walk(scale: float) -> list[SearchPoint]:
        search, trials = QuickSearch(load_search_space(), limits), []
        while (trial := search.ask()) is not None:
            trials.append(trial)
            value = scale * _synthetic(trial)
            search.tell(trial, Outcome(ok=True, throughput=value, score=math.log(value)))
        return trials

    assert log_score_walk(1.0) == log_score_walk(1e4) == _walk(
        QuickSearch(load_search_space(), limits), _synthetic)


def test_optuna_search_finds_the_best_region_and_resumes_its_study(tmp_path):
    from analyzer.search.optuna import OptunaSearch, OptunaSettings

    limits = SearchLimits(own_max_batch_size=8, max_model_batch_size=32, max_instance_count=4,
                          max_concurrency=256)  # fmt: skip
    settings = OptunaSettings(storage=f"sqlite:///{tmp_path / 'study.db'}", study_name="s",
                              seed=1, min_trials=20, max_trials=60)  # fmt: skip

    def walk(search):
        trials = []
        while (trial := search.ask()) is not None:
            trials.append(trial)
            value = _synthetic(trial)
            search.tell(trial, Outcome(ok=True, throughput=value, score=value))
        return trials

    brute = _walk(BruteSearch(load_search_space(), limits), _synthetic)
    first = walk(OptunaSearch(load_search_space(), limits, settings))
    best_brute = max(_synthetic(t) for t in brute)
    assert max(_synthetic(t) for t in first) >= 0.95 * best_brute
    assert len(first) <= 0.25 * len(brute)
    assert len(set(first)) == len(first)
    # a second process on the same study: trials already finished are not measured again
    again = OptunaSearch(load_search_space(), limits, settings)
    assert again._completed() >= 20


def test_two_searches_sharing_a_study_never_measure_the_same_point(tmp_path):
    from analyzer.search.optuna import OptunaSearch, OptunaSettings

    limits = SearchLimits(own_max_batch_size=8, max_model_batch_size=8, max_instance_count=2,
                          max_concurrency=16)  # fmt: skip
    settings = OptunaSettings(storage=f"sqlite:///{tmp_path / 'shared.db'}", study_name="s",
                              seed=None, min_trials=30, max_trials=40,
                              max_percentage=100)  # fmt: skip
    searches = [OptunaSearch(load_search_space(), limits, settings) for _ in range(2)]
    study_points: list[list] = [[], []]

    def drive(i: int) -> None:  # one thread per search, as two processes would run
        search = searches[i]
        while (trial := search.ask()) is not None:
            if search.phase == "study":
                study_points[i].append(trial)
            time.sleep(0.01)  # measuring
            value = _synthetic(trial)
            search.tell(trial, Outcome(ok=True, throughput=value, score=value))
        search.close()

    threads = [threading.Thread(target=drive, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert all(study_points), "both searches measured study points"
    measured = study_points[0] + study_points[1]
    assert len(measured) >= 20
    assert len(set(measured)) == len(measured)  # the two divided the study's points
    finished = [t.user_attrs["point"] for t in searches[0].ledger.study.get_trials()
                if t.state.name == "COMPLETE"]  # fmt: skip
    assert len(finished) >= len(measured)
    assert len(set(finished)) == len(finished)  # no point finished twice, sweeps included


def test_help_lists_the_flags():
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "analyzer", "profile", "--help"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 0
    for flag in ("--run-config-search-max-concurrency", "--override-output-model-repository",
                 "--latency-budget", "--optuna-max-trials", "--storage", "--shape"):
        assert flag in run.stdout


def test_pareto_front_of_several_objectives_ranks_first():
    def result(name, points):
        r = ConfigResult(model="m", name=name, params={"n": name}, description={},
                         config_text="", path="")  # fmt: skip
        for value, (throughput, p99) in enumerate(points, 1):
            r.measurements.append(Measurement(
                model="m", config_name=name, load="concurrency", value=value, batch_size=1,
                metrics={"perf_throughput": throughput, "perf_latency_p99": p99}))
        return r

    fast = result("fast", [(1000, 20.0)])  # most throughput, slow
    quick = result("quick", [(300, 1.0)])  # least latency
    middle = result("middle", [(600, 5.0)])  # on the front between them
    worse = result("worse", [(500, 6.0), (250, 2.0)])  # dominated by middle and by quick
    ranker = Ranker({"perf_throughput": 1.0}, {}, pareto=("perf_throughput", "perf_latency_p99"))
    ranked = ranker.rank([worse, quick, middle, fast])
    assert [r.name for r in ranked] == ["fast", "middle", "quick", "worse"]
    assert [r.pareto for r in ranked] == [True, True, True, False]
    # by throughput alone "worse" beats "quick"; the front puts every non-dominated config first
    assert Ranker({"perf_throughput": 1.0}, {}).rank([worse, quick])[0].name == "worse"
    # a constraint takes points off the front: with p99 <= 10 ms, "fast" cannot be on it
    limited = Ranker({"perf_throughput": 1.0}, {"perf_latency_p99": {"max": 10.0}},
                     pareto=("perf_throughput", "perf_latency_p99"))  # fmt: skip
    ranked = limited.rank([worse, quick, middle, fast])
    assert [r.name for r in ranked][-1] == "fast" and not ranked[-1].pareto


def test_optuna_trial_floor_scales_with_a_small_space(tmp_path):
    """The held-out-like space (2 instance counts x 5 batch sizes x 3 delays, c <= 16): MA's fixed
    20 trials are most of the study there. The scaled floor measures fewer points and finds the
    same best config as 20 trials do, seed for seed."""
    from analyzer.search.optuna import OptunaSearch, OptunaSettings, scaled_min_trials

    assert [scaled_min_trials(n) for n in (20, 150, 180, 200, 3000)] == [10, 15, 18, 20, 20]
    limits = SearchLimits(own_max_batch_size=8, max_model_batch_size=16, max_instance_count=2,
                          max_concurrency=16)  # fmt: skip
    brute = _walk(BruteSearch(load_search_space(), limits), _synthetic)

    def search(seed: int, min_trials: int | None) -> list:
        settings = OptunaSettings(storage=f"sqlite:///{tmp_path / f'{seed}-{min_trials}.db'}",
                                  study_name="s", seed=seed, min_trials=min_trials)  # fmt: skip
        optuna_search = OptunaSearch(load_search_space(), limits, settings)
        assert optuna_search.space_size == 2 * 5 * 3 * 5
        assert optuna_search.min_trials == (15 if min_trials is None else min_trials)
        try:
            return _walk(optuna_search, _synthetic)
        finally:
            optuna_search.close()  # its ledger's heartbeat thread

    for seed in (0, 1, 2):
        scaled, fixed = search(seed, None), search(seed, 20)
        assert len(scaled) < len(fixed) < len(brute)
        assert max(map(_synthetic, scaled)) == max(map(_synthetic, fixed))


def test_optuna_sweeps_walk_outward_from_the_best_load_and_respect_a_latency_limit(tmp_path):
    """The final sweeps start at each chosen config's best sampled load: with no constraint they
    end at the top load that still gains, with fewer points than ascending sweeps from
    concurrency 1; with a latency limit the best load that meets it is found below."""
    from analyzer.search.optuna import OptunaSearch, OptunaSettings

    limits = SearchLimits(own_max_batch_size=8, max_model_batch_size=16, max_instance_count=2,
                          max_concurrency=64)  # fmt: skip

    def latency_ms(trial):  # closed loop: latency = concurrency / throughput
        return 1000.0 * trial.value / _synthetic(trial)

    def run(seed: int, limit_ms: float | None):
        settings = OptunaSettings(storage=f"sqlite:///{tmp_path / f'{seed}-{limit_ms}.db'}",
                                  study_name="s", seed=seed)  # fmt: skip
        search = OptunaSearch(load_search_space(), limits, settings)
        trials = []
        try:
            while (trial := search.ask()) is not None:
                trials.append((search.phase, trial))
                meets = limit_ms is None or latency_ms(trial) <= limit_ms
                search.tell(trial, Outcome(ok=True, throughput=_synthetic(trial),
                                           satisfies_constraints=meets,
                                           breaks_latency_limit=not meets))  # fmt: skip
        finally:
            search.close()
        return search, trials

    for seed in (0, 1):
        search, trials = run(seed, None)
        sweeps = [t for phase, t in trials if phase == "sweeps"]
        chosen = search._chosen()
        assert sweeps and {t.params_json for t in sweeps} <= set(chosen)
        # an ascending sweep would measure every level of every chosen config
        assert len(sweeps) < len(chosen) * len(search.levels) / 2
        for params_json in chosen:  # each ends at the top load: throughput grows with it here
            measured = {t.value for _, t in trials if t.params_json == params_json}
            assert max(search.levels) in measured
        search, trials = run(seed, LIMIT_MS)
        measured = [t for _, t in trials]
        for params_json in search._chosen():
            levels = [SearchPoint(params_json, "concurrency", c, 1) for c in search.levels]
            possible = [t for t in levels if latency_ms(t) <= LIMIT_MS]
            if not possible:
                continue
            found = [t for t in measured if t.params_json == params_json
                     and latency_ms(t) <= LIMIT_MS]  # fmt: skip
            assert found, params_json  # the sweep went down to a load that meets the limit
            best = max(map(_synthetic, possible))
            assert max(map(_synthetic, found)) >= 0.95 * best, params_json


LIMIT_MS = 60.0


def test_version_as_ma_has_it():
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "analyzer", "--version"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 0 and run.stdout.startswith("model-analyzer 0."), run.stdout


def test_brute_bisects_the_load_between_the_last_point_within_the_constraints_and_the_first_not():
    """MA's run_config_search_max_binary_search_steps: after the sweeps, a top config's load is
    bisected between the last point that meets the constraints (concurrency 16 here) and the
    first that does not (32), in at most that many points; none with fixed load values or when
    no point breaks a constraint."""

    def run(**caps):
        limits = SearchLimits(own_max_batch_size=0, max_instance_count=1, max_concurrency=64,
                              **caps)  # fmt: skip
        search = BruteSearch(load_search_space(), limits)
        trials = []
        while (trial := search.ask()) is not None:
            trials.append(trial)
            search.tell(trial, Outcome(ok=True, throughput=10.0 * trial.value,
                                       satisfies_constraints=trial.value <= caps.pop("_limit", 20)))
        return [t.value for t in trials if not t.params]

    assert run() == [1, 2, 4, 8, 16, 32, 64, 24, 20, 22, 21]
    assert run(binary_search_steps=2) == [1, 2, 4, 8, 16, 32, 64, 24, 20]
    assert run(binary_search_steps=0) == [1, 2, 4, 8, 16, 32, 64]
    assert run(concurrency=[8, 32]) == [8, 32]


def test_quick_without_final_sweeps_and_optuna_at_the_concurrency_formula(tmp_path):
    """MA's concurrency_sweep_disable (no full load sweep of the top configs after the search)
    and use_concurrency_formula (optuna: each config at 2 x max_batch_size x instances)."""
    from analyzer.search.optuna import OptunaSearch, OptunaSettings
    from analyzer.search.quick import QuickSearch

    caps = {"own_max_batch_size": 8, "max_model_batch_size": 32, "max_instance_count": 4,
            "max_concurrency": 256}  # fmt: skip
    swept = _walk(QuickSearch(load_search_space(), SearchLimits(**caps)), _synthetic)
    unswept = _walk(QuickSearch(load_search_space(), SearchLimits(**caps, sweep_disable=True)),
                    _synthetic)  # fmt: skip
    assert len(unswept) < len(swept) and swept[: len(unswept)] == unswept
    settings = OptunaSettings(storage=f"sqlite:///{tmp_path / 'study.db'}", study_name="s",
                              seed=1, min_trials=20, max_trials=30)  # fmt: skip
    limits = SearchLimits(**caps, sweep_disable=True, concurrency_formula=True)
    search = OptunaSearch(load_search_space(), limits, settings)
    trials = _walk(search, _synthetic)
    searched = [t for t in trials if t.params]
    assert len(searched) >= 10
    for t in searched:  # the formula's own value, within the space's concurrency levels
        target = 2 * t.params.get("max_batch_size", 1) * t.params["instance_count"]
        assert t.value == min(target, search.levels[-1]), t
    assert any(t.value not in search.levels for t in searched)  # e.g. 24: not a power of two


def test_early_exit_as_ma_has_it():
    """MA's early_exit_enable: fixed concurrency values stop once throughput plateaus, and a
    manual search skips larger max_batch_size values once one does not beat the smaller ones;
    without it every value and every option is measured, as given."""
    levels = [1, 2, 4, 8, 16, 32, 64, 128]

    def run(**caps):
        limits = SearchLimits(own_max_batch_size=8, concurrency=levels, **caps)
        return _walk(BruteSearch(load_search_space(), limits),
                     lambda t: 100.0 * min(t.value, 4) * {1: 1, 2: 2, 4: 1.5, 8: 3}.get(
                         t.params.get("max_batch_size", 1), 1))  # fmt: skip

    manual = {"max_batch_size": [1, 2, 4, 8]}
    every = run(manual=manual)
    assert len(every) == 5 * len(levels)  # the default and four options, every value
    early = run(manual=manual, early_exit=True)
    default = [t.value for t in early if not t.params]
    assert default == [1, 2, 4, 8, 16, 32]  # flat from 4: the plateau rule stops it
    sizes = [t.params["max_batch_size"] for t in early if t.params]
    assert sorted(set(sizes)) == [1, 2, 4]  # 4 is not better than 2: 8 is skipped


def test_quick_and_optuna_search_request_rates(tmp_path):
    """MA's request_rate and request_rate_search_enable in quick and optuna modes: the load
    climbed and swept is the request rate (the given values, or the space's levels), not
    concurrency."""
    from analyzer.search.optuna import OptunaSearch, OptunaSettings
    from analyzer.search.quick import QuickSearch

    caps = {"own_max_batch_size": 8, "max_model_batch_size": 16, "max_instance_count": 2,
            "max_request_rate": 1024}  # fmt: skip
    for limits in (SearchLimits(**caps, request_rate_search=True),
                   SearchLimits(**caps, request_rate=[64, 256])):  # fmt: skip
        settings = OptunaSettings(storage=f"sqlite:///{tmp_path / f'{id(limits)}.db'}",
                                  study_name="s", seed=1, min_trials=10, max_trials=15)  # fmt: skip
        for search in (QuickSearch(load_search_space(), limits),
                       OptunaSearch(load_search_space(), limits, settings)):  # fmt: skip
            trials = _walk(search, lambda t: min(float(t.value), 300.0))
            assert trials and {t.load for t in trials} == {"request_rate"}
            if limits.request_rate:
                assert {t.value for t in trials} <= {64, 256}
            else:
                assert len({t.value for t in trials}) > 2


def test_quick_and_optuna_search_the_values_model_config_parameters_lists(tmp_path):
    """MA's optuna mode takes model_config_parameters' max_batch_size, instance_group count and
    max_queue_delay_microseconds lists as its dimensions; quick climbs over them too (before,
    both fell back to brute force without a word). Keys they cannot search are noted."""
    from analyzer.search.optuna import OptunaSearch, OptunaSettings
    from analyzer.search.quick import QuickSearch

    manual = {"max_batch_size": [2, 6], "instance_group": [{"kind": "KIND_CPU", "count": [1, 3]}],
              "dynamic_batching": {"max_queue_delay_microseconds": [50, 500]}}  # fmt: skip
    limits = SearchLimits(own_max_batch_size=8, max_concurrency=64, manual=manual)
    settings = OptunaSettings(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="s", seed=1,
                              min_trials=10, max_trials=12)  # fmt: skip
    for search in (QuickSearch(load_search_space(), limits),
                   OptunaSearch(load_search_space(), limits, settings)):  # fmt: skip
        searched = [t.params for t in _walk(search, _synthetic) if t.params]
        assert searched
        assert {p["max_batch_size"] for p in searched} <= {2, 6}
        assert {p["instance_count"] for p in searched} <= {1, 3}
        assert {p["max_queue_delay_microseconds"] for p in searched} <= {50, 500}
    (tmp_path / "c.yaml").write_text(
        f"model_repository: {EXAMPLES}\nrun_config_search_mode: optuna\nprofile_models:\n"
        "  add_sub:\n    model_config_parameters: {max_batch_size: [2, 4], "
        "parameters: {x: {string_value: y}}}\n")  # fmt: skip
    config = load_profile_config(["-f", str(tmp_path / "c.yaml")], cwd=tmp_path)
    assert any("parameters only vary in brute mode" in note for note in config.notes)


def test_perf_analyzer_max_threads_caps_the_load_generators_processes(tmp_path):
    """perf_analyzer's max-threads (its async threads, each with many requests in flight) is the
    most processes our load generator grows to; async is how it always sends; sync is noted."""
    from analyzer.profile_setup import measure_options

    yaml_file = tmp_path / "cfg.yaml"
    yaml_file.write_text("perf_analyzer_flags: {max-threads: 2, async: true, sync: true}\n")
    config = load_profile_config(["-m", str(EXAMPLES), "--profile-models", "add_sub", "-f",
                                  str(yaml_file)], cwd=tmp_path)  # fmt: skip
    said = " ".join(config.notes)
    assert "'sync' has no effect here" in said
    assert "'max-threads'" not in said and "'async'" not in said
    _, options = measure_options(config, config.models[0])
    assert options.max_threads == 2
    assert [options.process_limit(cores) for cores in (1, 2, 16)] == [1, 2, 2]
    assert dataclasses.replace(options, max_threads=0).process_limit(16) == 16
    yaml_file.write_text("perf_analyzer_flags: {max-threads: many}\n")
    config = load_profile_config(["-m", str(EXAMPLES), "--profile-models", "add_sub", "-f",
                                  str(yaml_file)], cwd=tmp_path)  # fmt: skip
    with pytest.raises(ValueError, match="'max-threads' is 'many'; expected a whole number"):
        measure_options(config, config.models[0])


def test_a_claim_is_keyed_from_its_creation_so_a_process_killed_then_stalls_no_other(
    tmp_path, monkeypatch
):
    """A claim's trial once got its key after `ask()`, attribute by attribute: a process killed
    in between left a running trial with no key, and every later claim of every process waited
    ten seconds for it, twice (the shared-study test once took 285 s instead of ~45). The key,
    point and owner are now written with the trial, in one storage call."""
    import optuna

    from analyzer.search import ledger as ledger_module
    from analyzer.search.ledger import Ledger, open_storage

    storage = open_storage(f"sqlite:///{tmp_path / 'shared.db'}")
    first, second = Ledger(storage, "s"), Ledger(storage, "s")
    try:
        def killed(*args, **kwargs):  # the process dies as it would set an attribute
            raise RuntimeError("killed")

        monkeypatch.setattr(optuna.Trial, "set_user_attr", killed)
        monkeypatch.setattr(first, "_beat", killed)  # and before its first heartbeat
        with pytest.raises(RuntimeError, match="killed"):
            first.claim(SearchPoint.make({"instance_count": 1}, "concurrency", 1, 1), wait=False)
        monkeypatch.undo()
        left = first.study.get_trials()
        assert left and all({"point", "host", "trial"} <= set(t.user_attrs) for t in left)

        def no_wait(seconds: float) -> None:
            raise AssertionError(f"a claim waited {seconds} s for a trial with no key")

        monkeypatch.setattr(ledger_module.time, "sleep", no_wait)
        claim = second.claim(SearchPoint.make({"instance_count": 2}, "concurrency", 1, 1),
                             wait=False)  # fmt: skip
        assert claim.state == "mine"
    finally:
        first.close()
        second.close()


def test_a_claim_whose_process_died_before_its_first_heartbeat_is_taken_over(
    tmp_path, monkeypatch
):
    """A claim created running had no heartbeat until its process beat once, and Optuna fails
    only trials with a heartbeat as stale: a process on another host killed in between left the
    point claimed forever, and a process waiting for it waited forever. A claim now runs only
    once it has beaten; another process fails a claim left waiting and takes the point."""
    from analyzer.search import ledger as ledger_module
    from analyzer.search.ledger import Ledger, open_storage

    monkeypatch.setattr(ledger_module, "UNKEYED_WAIT_S", 2.0)  # a live claim runs in ms
    storage = open_storage(f"sqlite:///{tmp_path / 'shared.db'}")
    first, second = Ledger(storage, "s"), Ledger(storage, "s")
    first.owner = "another-host:4242"  # not this host's, so not seen as dead by its pid
    point = SearchPoint.make({"instance_count": 1}, "concurrency", 1, 1)
    try:
        def killed(*args, **kwargs):
            raise RuntimeError("killed")

        monkeypatch.setattr(first, "_beat", killed)
        with pytest.raises(RuntimeError, match="killed"):
            first.claim(point, wait=False)
        claim = second.claim(point, wait=False)
        assert claim.state == "mine"
        states = {t.number: t.state.name for t in second.study.get_trials()}
        assert states == {0: "FAIL", 1: "RUNNING"}
    finally:
        first.close()
        second.close()


def test_a_claim_that_took_long_to_run_gives_itself_up_and_claims_again(tmp_path, monkeypatch):
    """Another process fails a claim left waiting UNKEYED_WAIT_S; a claim that took over half
    that long from its creation to running gives itself up, so no two processes go on with one
    point."""
    from analyzer.search import ledger as ledger_module
    from analyzer.search.ledger import Ledger, open_storage

    monkeypatch.setattr(ledger_module, "UNKEYED_WAIT_S", 4.0)  # a live claim runs in ms
    storage = open_storage(f"sqlite:///{tmp_path / 'shared.db'}")
    ledger = Ledger(storage, "s")
    beat = ledger._beat
    slow = [True]

    def slow_once(trial_id: int) -> None:
        if slow.pop() if slow else False:
            ledger_module.time.sleep(2.5)
        beat(trial_id)

    monkeypatch.setattr(ledger, "_beat", slow_once)
    try:
        claim = ledger.claim(SearchPoint.make({"instance_count": 1}, "concurrency", 1, 1), False)
        assert claim.state == "mine" and claim.trial is not None and claim.trial.number == 1
        assert [t.state.name for t in ledger.study.get_trials()] == ["PRUNED", "RUNNING"]
    finally:
        ledger.close()


def test_a_storage_too_slow_to_register_a_claim_is_an_error_not_an_endless_retry(
    tmp_path, monkeypatch
):
    """A claim that took over half of UNKEYED_WAIT_S to run gives itself up and claims again; on
    a storage that is always that slow it used to retry for ever, the search silently stuck. A
    few give-ups in a row now end the run with an error that names the storage and the times."""
    from analyzer.search import ledger as ledger_module
    from analyzer.search.ledger import Ledger, StudyStorageError, open_storage

    monkeypatch.setattr(ledger_module, "UNKEYED_WAIT_S", 0.2)
    storage = open_storage(f"sqlite:///{tmp_path / 'shared.db'}")
    ledger = Ledger(storage, "s")
    beat = ledger._beat

    def slow(trial_id: int) -> None:  # every claim takes longer than the 0.1 s allowed
        ledger_module.time.sleep(0.15)
        beat(trial_id)

    monkeypatch.setattr(ledger, "_beat", slow)
    try:
        with pytest.raises(StudyStorageError, match=r"--storage 'sqlite:///.*shared\.db' took "
                           r"\d+\.\d, \d+\.\d, \d+\.\d s to register 3 claims in a row"):
            ledger.claim(SearchPoint.make({"instance_count": 1}, "concurrency", 1, 1), True)
        assert [t.state.name for t in ledger.study.get_trials()] == ["PRUNED"] * 3
    finally:
        ledger.close()


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        ("{percentile: 200}", "'percentile' is 200; expected a whole number, 1 to 99"),
        ("{percentile: abc}", "'percentile' is 'abc'; expected a whole number, 1 to 99"),
        ("{stability-percentage: abc}", "'stability-percentage' is 'abc'; expected a number"),
        ("{measurement-mode: bogus}", "'measurement-mode' is 'bogus'; expected one of adaptive"),
        ("{request-distribution: weird}", "'request-distribution' is 'weird'; expected one of"),
        ("{string-length: -1}", "'string-length' is -1; expected a whole number, 1 or more"),
        ("{max-trials: 0}", "'max-trials' is 0; expected a whole number, 1 or more"),
        ("{shape: 5}", "'shape' is 5; expected NAME:d1,d2,..."),
    ],
)  # fmt: skip
def test_bad_perf_analyzer_flags_are_named_before_any_measurement(tmp_path, flags, needle):
    """They were "invalid literal for int()" with no key, numpy's "Percentiles must be in the
    range [0, 100]" once the worker had started, a TypeError, or accepted and ignored."""
    from analyzer.profile_setup import measure_options

    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text(f"perf_analyzer_flags: {flags}\n")
    config = load_profile_config(["-m", str(EXAMPLES), "--profile-models", "add_sub", "-f",
                                  str(yaml_file)], cwd=tmp_path)  # fmt: skip
    with pytest.raises(ValueError, match=re.escape(needle)):
        measure_options(config, config.models[0])


def test_perf_analyzer_flags_batch_size_sets_the_client_batch(tmp_path):
    """The help said batch-size was honoured; it was read by nothing and every point ran b=1."""
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("perf_analyzer_flags: {batch-size: 4}\n")
    argv = ["-m", str(EXAMPLES), "--profile-models", "add_sub", "-f", str(yaml_file)]
    assert load_profile_config(argv, cwd=tmp_path).models[0].batch_sizes == [4]
    yaml_file.write_text("perf_analyzer_flags: {batch-size: 4}\nprofile_models:\n"
                         "  add_sub: {parameters: {batch_sizes: [2]}}\n")  # fmt: skip
    argv = ["-m", str(EXAMPLES), "-f", str(yaml_file)]
    assert load_profile_config(argv, cwd=tmp_path).models[0].batch_sizes == [2]
    yaml_file.write_text("perf_analyzer_flags: {batch-size: abc}\n")
    with pytest.raises(ProfileConfigError, match="'perf_analyzer_flags batch-size' has 'abc'"):
        load_profile_config(["-m", str(EXAMPLES), "--profile-models", "add_sub", "-f",
                             str(yaml_file)], cwd=tmp_path)  # fmt: skip
