"""Reading Prometheus SD lists and gateway model lists: shapes accepted, shapes refused."""

from __future__ import annotations

import json

import pytest

from kvwatch.discovery.formats import (
    ListedModel,
    ListError,
    TargetGroup,
    parse_models,
    parse_sd_json,
    parse_sd_text,
)

SD = [
    {"targets": ["10.0.0.1:8000", "10.0.0.2:8000"], "labels": {"__kvwatch_model": "glm-5.3"}},
    {"targets": ["10.0.0.3:8000"]},
]


def test_an_http_sd_answer_gives_each_group_with_its_targets_and_labels() -> None:
    """Prometheus' JSON format reads into target groups; missing labels read as none."""
    assert parse_sd_json(json.dumps(SD)) == [
        TargetGroup(("10.0.0.1:8000", "10.0.0.2:8000"), {"__kvwatch_model": "glm-5.3"}),
        TargetGroup(("10.0.0.3:8000",), {}),
    ]


def test_a_file_sd_file_may_be_yaml_and_an_empty_file_lists_nothing() -> None:
    """YAML reads like JSON; an empty file (a controller mid-write) is an empty list."""
    text = "- targets: ['vllm-0.serving:8000']\n  labels:\n    team: inference\n"
    assert parse_sd_text(text) == [TargetGroup(("vllm-0.serving:8000",), {"team": "inference"})]
    assert parse_sd_text("") == []


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ('{"targets": []}', "must be a list of target groups, not a mapping"),
        ("[1]", "group 1: must be a mapping with targets and labels"),
        ('[{"targets": "a:1"}]', 'group 1: "targets" must be a list of "host:port" strings'),
        ('[{"targets": ["a:1"], "labels": {"x": 1}}]', 'group 1: "labels" must map label names'),
        ('[{"targets": ["a:1"], "lables": {}}]', 'group 1: unknown key "lables"'),
        ("[{", "not JSON"),
    ],
)
def test_a_list_of_another_shape_is_refused_saying_where(body: str, error: str) -> None:
    """Each shape error names the group and what is wrong with it."""
    with pytest.raises(ListError, match=error.replace("(", r"\(")):
        parse_sd_json(body)


def test_an_openai_list_gives_vllm_max_model_len_and_nothing_for_a_gateway_without_it() -> None:
    """vLLM/SGLang's max_model_len is the window; a card without it states none."""
    body = {"data": [{"id": "glm-5.3", "max_model_len": 131072}, {"id": "qwen3"}]}
    assert parse_models("openai", json.dumps(body)) == [
        ListedModel("glm-5.3", 131072),
        ListedModel("qwen3", None),
    ]


def test_a_litellm_model_info_list_names_each_model_once_with_max_input_tokens() -> None:
    """model_name is the model; deployments of one name are one endpoint; null is no window."""
    body = {
        "data": [
            {"model_name": "glm-5.3", "model_info": {"max_input_tokens": 200000}},
            {"model_name": "glm-5.3", "model_info": {"max_input_tokens": 100000}},
            {"model_name": "qwen3", "model_info": {"max_input_tokens": None}},
        ]
    }
    assert parse_models("litellm", json.dumps(body)) == [
        ListedModel("glm-5.3", 200000),
        ListedModel("qwen3", None),
    ]


def test_an_openrouter_list_prefers_the_top_providers_context_length() -> None:
    """top_provider.context_length wins over the model's; the model's is the fallback."""
    body = {
        "data": [
            {"id": "a/b", "context_length": 1000000, "top_provider": {"context_length": 163840}},
            {"id": "c/d", "context_length": 32768, "top_provider": {"context_length": None}},
        ]
    }
    assert parse_models("openrouter", json.dumps(body)) == [
        ListedModel("a/b", 163840),
        ListedModel("c/d", 32768),
    ]


def test_a_model_list_without_data_or_names_is_refused() -> None:
    """No data list, or an entry without its name key, is a list error."""
    with pytest.raises(ListError, match='must be a JSON object with a "data" list'):
        parse_models("openai", "[]")
    with pytest.raises(ListError, match='data\\[0\\]: needs a "model_name" string'):
        parse_models("litellm", json.dumps({"data": [{"id": "glm"}]}))
