from __future__ import annotations

import pytest

from analyzer.config.model_config import (
    ConfigError,
    format_model_config,
    load_model_config,
    model_config_from_json,
    model_config_to_dict,
    parse_model_config,
)
from analyzer.repository.repository import RepositoryError, read_model

CONFIG = """
name: "m"
platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3, -1 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 10 ] } ]
dynamic_batching { max_queue_delay_microseconds: 100 preferred_batch_size: [ 4, 8 ] }
"""


def test_parse_error_names_file_line_and_field(tmp_path):
    path = tmp_path / "config.pbtxt"
    path.write_text('name: "m"\nmax_batch_size: 8\nmax_batch_sise: 4\n')
    with pytest.raises(ConfigError) as info:
        load_model_config(path)
    message = str(info.value)
    assert str(path) in message and "line 3" in message and "max_batch_sise" in message


def test_bad_value_names_the_field():
    with pytest.raises(ConfigError, match="max_batch_size"):
        parse_model_config('max_batch_size: "eight"', "cfg")


def test_round_trip_is_lossless():
    config = parse_model_config(CONFIG)
    again = parse_model_config(format_model_config(config))
    assert again == config


def test_json_form_matches_triton():
    data = model_config_to_dict(parse_model_config(CONFIG))
    assert data["input"][0]["dims"] == [3, -1]  # int64 as JSON numbers, not strings
    assert data["input"][0]["data_type"] == "TYPE_FP32"
    assert data["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    assert data["dynamic_batching"]["preferred_batch_size"] == [4, 8]
    assert data["max_batch_size"] == 8 and data["backend"] == ""
    assert model_config_from_json(data) == parse_model_config(CONFIG)


def test_json_override_error_is_clear():
    with pytest.raises(ConfigError, match="config JSON"):
        model_config_from_json('{"max_batch_size": "x"}')


def _model(tmp_path, name="m", config=CONFIG, versions=("1",)):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.pbtxt").write_text(config)
    for v in versions:
        (folder / v).mkdir()
    return folder


def test_version_policy_latest_all_specific(tmp_path):
    _model(tmp_path, versions=("1", "2", "10", "notes", "__pycache__"))
    assert read_model(tmp_path, "m").versions == [10]
    cfg = tmp_path / "m" / "config.pbtxt"
    cfg.write_text(CONFIG + "version_policy { latest { num_versions: 2 } }")
    assert read_model(tmp_path, "m").versions == [2, 10]
    cfg.write_text(CONFIG + "version_policy { all {} }")
    assert read_model(tmp_path, "m").versions == [1, 2, 10]
    cfg.write_text(CONFIG + "version_policy { specific { versions: [1, 10] } }")
    assert read_model(tmp_path, "m").versions == [1, 10]
    cfg.write_text(CONFIG + "version_policy { specific { versions: [3] } }")
    with pytest.raises(RepositoryError, match="version"):
        read_model(tmp_path, "m")


def test_name_must_match_folder(tmp_path):
    _model(tmp_path, name="other")
    with pytest.raises(RepositoryError, match="'name' is 'm' but the model folder is 'other'"):
        read_model(tmp_path, "other")


def test_missing_model_and_unknown_platform(tmp_path):
    with pytest.raises(RepositoryError, match="'nope' is not in repository"):
        read_model(tmp_path, "nope")
    _model(tmp_path, config='name: "m"\nplatform: "tensorrt_plan"\n')
    with pytest.raises(RepositoryError, match="tensorrt_plan"):
        read_model(tmp_path, "m")


def test_backend_is_filled_from_platform(tmp_path):
    _model(tmp_path)
    source = read_model(tmp_path, "m")
    assert source.backend == "pytorch" and source.config.backend == "pytorch"
    assert source.model_file(1).name == "model.pt"


def test_unsupported_scheduling_is_refused_not_ignored(tmp_path):
    import shutil

    from serving import EXAMPLES

    from analyzer.worker.manager import ModelManager

    shutil.copytree(EXAMPLES / "tiny_cnn", tmp_path / "tiny_cnn")
    config = tmp_path / "tiny_cnn" / "config.pbtxt"
    original = config.read_text()
    config.write_text(original + "\nsequence_batching { state [ { input_name: \"S_IN\" "
                      "output_name: \"S_OUT\" data_type: TYPE_FP32 dims: [ 1 ] } ] }\n")
    errors = ModelManager(tmp_path).startup([])
    assert errors == [
        "failed to load 'tiny_cnn': model 'tiny_cnn': sequence_batching.state (implicit state) "
        "is not supported by this worker"
    ]
    config.write_text(original + "\nsequence_batching { iterative_sequence: true }\n")
    manager = ModelManager(tmp_path)
    assert manager.startup([]) == []  # served now: each request a sequence of its own
    manager.shutdown()
    config.write_text(original + "\nensemble_scheduling { step [ { model_name: \"x\" } ] }\n")
    errors = ModelManager(tmp_path).startup([])
    assert len(errors) == 1 and 'ensemble_scheduling needs platform: "ensemble"' in errors[0]


@pytest.mark.parametrize(
    ("groups", "gpu_capable", "kind"),
    [
        ("", True, "GPU"),
        ("", False, "CPU"),  # e.g. a CPU-only onnxruntime on a GPU host: Triton takes the CPU
        ("instance_group [ { kind: KIND_AUTO } ]", False, "CPU"),
        ("instance_group [ { kind: KIND_AUTO } ]", True, "GPU"),
    ],
)
def test_default_instance_kind_follows_the_backends_gpu_support(
    monkeypatch, groups, gpu_capable, kind
):
    from analyzer.worker import devices
    from analyzer.worker.model import instance_specs

    monkeypatch.setattr(devices, "gpu_count", lambda: 1)
    config = parse_model_config(CONFIG + groups)
    specs = instance_specs(config, gpu_capable)
    assert [s.kind for s in specs] == [kind]
