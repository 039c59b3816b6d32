"""Restricted-API flag parsing (Triton's syntax), the profiler's key, and the model-name rule."""

from __future__ import annotations

import pytest

from analyzer.worker.errors import InferError
from analyzer.worker.limits import parse_size
from analyzer.worker.names import check_model_name
from analyzer.worker.restrict import KEY_HEADER, REPOSITORY_KEY_ENV, RestrictionError, build


def test_triton_syntax_restricts_each_named_category():
    rules = build("--http-restricted-api", ["model-repository,statistics:X-Key=abc"], environ={})
    assert rules.check("model-repository", {}) == "This API is restricted, expecting header 'x-key'"
    assert rules.check("statistics", {"x-key": "wrong"}) is not None
    assert rules.check("statistics", {"x-key": "abc"}) is None
    assert rules.check("inference", {}) is None  # not named: open


@pytest.mark.parametrize(
    "text, words",
    [
        ("model-repository", "is not '<api>"),
        ("model-repository:x-key", "is not '<api>"),
        (":x=1", "is not '<api>"),
        ("repository:x=1", "unknown API 'repository'"),
    ],
)
def test_bad_restriction_flags_are_one_sentence(text, words):
    with pytest.raises(RestrictionError, match=words):
        build("--http-restricted-api", [text], environ={})


def test_a_category_restricted_twice_is_refused():
    with pytest.raises(RestrictionError, match="twice"):
        build("--grpc-restricted-protocol", ["inference:a=1", "inference:b=2"], environ={})


def test_the_profilers_key_comes_from_the_environment():
    rules = build("--http-restricted-api", [], environ={REPOSITORY_KEY_ENV: "s3cret"})
    assert rules.check("model-repository", {}) is not None
    assert rules.check("model-repository", {KEY_HEADER: "s3cret"}) is None
    assert rules.check("inference", {}) is None
    with pytest.raises(RestrictionError, match=REPOSITORY_KEY_ENV):
        build("--http-restricted-api", ["model-repository:a=b"],
              environ={REPOSITORY_KEY_ENV: "k"})  # fmt: skip


@pytest.mark.parametrize(
    "name", ["", ".", "..", "../x", "a/b", "a\\b", "-rf", "a\0b", "x" * 256, "bad\nname"]
)
def test_model_names_that_could_leave_a_folder_are_refused(name):
    with pytest.raises(InferError, match="invalid model name"):
        check_model_name(name)


@pytest.mark.parametrize("name", ["add_sub", "tiny_cnn_config_3", "model.v2", "a-b", "x" * 255])
def test_ordinary_model_names_pass(name):
    assert check_model_name(name) == name


def test_sizes():
    assert parse_size("64MB") == 64 << 20
    assert parse_size("1g") == 1 << 30
    assert parse_size("65536") == 65536
    assert parse_size("64KiB") == 64 << 10
    for bad in ("", "lots", "-1", "0"):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_explicit_mode_on_a_non_loopback_address_warns(capsys):
    from analyzer.worker.restrict import Restrictions
    from analyzer.worker.server import ServeOptions, _warn_if_exposed

    def warned(host: str, mode: str = "explicit", rules=None) -> str:
        opts = ServeOptions(model_repository=".", host=host, model_control_mode=mode)
        rules = rules or Restrictions()
        _warn_if_exposed(opts, rules, rules)
        return capsys.readouterr().err

    assert warned("127.0.0.1") == ""
    assert warned("::1") == ""
    assert warned("localhost") == ""
    assert warned("0.0.0.0", mode="none") == ""
    text = warned("0.0.0.0")
    assert "warning: --model-control-mode explicit on 0.0.0.0" in text
    assert "--http-restricted-api" in text
    guarded = build("--http-restricted-api", ["model-repository:k=v"], environ={})
    assert "--http-restricted-api" not in warned("10.1.2.3", rules=guarded)
    assert "warning" in warned("10.1.2.3", rules=guarded)


def test_our_clients_quote_a_model_name_as_tritonclient_does():
    """A model folder 'add sub' passed the check, then profile died with http.client's
    InvalidURL: the load and infer paths carried the name raw."""
    from urllib.parse import unquote

    from analyzer.loadgen.payload import http_infer_path

    path = http_infer_path("add sub/..", "1")
    assert path == "/v2/models/add%20sub%2F../versions/1/infer"
    assert unquote(path.split("/")[3]) == "add sub/.."  # the worker unquotes the segment
