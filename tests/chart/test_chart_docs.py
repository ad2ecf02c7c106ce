"""values.yaml is the source of truth: the README table is generated from it, the schema lists exactly its keys and
accepts its defaults, and NOTES tell the user what to check next."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tests.support.chartkit import CHART_DIR, notes, render
from tests.support.values_doc import END, START, expected_readme, main, parse_values_doc

VALUES_TEXT = (CHART_DIR / "values.yaml").read_text()


def test_readme_values_table_is_up_to_date() -> None:
    readme = (CHART_DIR / "README.md").read_text()
    assert readme == expected_readme(readme, VALUES_TEXT), "run .venv/bin/python -m tests.support.values_doc"
    assert main(["--check"]) == 0


def test_drift_and_undocumented_keys_are_reported() -> None:
    readme = (CHART_DIR / "README.md").read_text()
    assert expected_readme(readme.replace("| `replicaCount` |", "| `replicas` |"), VALUES_TEXT) == readme
    with pytest.raises(ValueError, match=r"values\.yaml keys without a `# --` comment: extra; document them"):
        expected_readme(readme, VALUES_TEXT + "\nextra: 1\n")
    with pytest.raises(ValueError, match=r"README\.md lacks the values-table markers"):
        expected_readme(readme.replace(START, ""), VALUES_TEXT)
    assert END in readme


def test_parser_skips_list_items_and_reads_continuations() -> None:
    text = "# -- a list\n# of maps.\nitems:\n  - key: x\n    other: y\n# -- after\nnext: 1\n"
    docs = parse_values_doc(text)
    assert [(d.path, d.description) for d in docs] == [("items", "a list of maps."), ("next", "after")]


def _schema_paths(schema: dict[str, Any], prefix: str = "") -> set[str]:
    paths: set[str] = set()
    for key, sub in schema.get("properties", {}).items():
        path = f"{prefix}{key}"
        paths.add(path)
        if sub.get("type") == "object" and "properties" in sub:
            paths |= _schema_paths(sub, f"{path}.")
    return paths


def _strict_everywhere(schema: dict[str, Any]) -> None:
    if "properties" in schema:
        assert schema.get("additionalProperties") is False, sorted(schema["properties"])
        for sub in schema["properties"].values():
            _strict_everywhere(sub)


def test_schema_lists_exactly_the_values_keys_and_is_strict() -> None:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    _strict_everywhere(schema)
    documented = {d.path for d in parse_values_doc(VALUES_TEXT)}
    # `global` is Helm's own key for values shared with subcharts; it is allowed but not a chart setting.
    assert _schema_paths(schema) - {"global"} == documented


def test_defaults_pass_the_schema_and_every_documented_key_exists() -> None:
    values = yaml.safe_load(VALUES_TEXT)
    for doc in parse_values_doc(VALUES_TEXT):
        node = values
        for part in doc.path.split("."):
            node = node[part]
    assert render({})


def test_notes_tell_how_to_watch_the_probe_and_read_the_geometry() -> None:
    text = notes({})
    assert "glm53 probe startup --profile glm53-flash --tensor-parallel-size 4 --chunk-size 1152" in text
    assert "1800 s" in text
    assert "Resolved LMCache MP geometry" in text
    assert "group_tokens_per_block=[1152, 1152, 1152, 1152, 1152, 0]" in text
    assert "8507 tokens at C=1152: 8064" in text
    assert "NOT YET VALIDATED" not in text and "UNSAFE FOR PRODUCTION" not in text
    glm53 = notes({"profile": "glm53"})
    assert "group_tokens_per_block=[64], so every chunk must be a multiple of 64" in glm53


def test_notes_point_at_the_stage_containers_log_when_weights_are_staged() -> None:
    text = notes({})
    assert "kubectl -n llm logs deploy/glm53-flash -c stage-weights -f" in text
    assert "downloads zai-org/GLM-5.3-Flash at revision\n   main and verifies it" in text
    assert "stage-weights" not in notes({"weights": {"staging": {"enabled": False}}})


def test_notes_warn_about_mtp_and_dev_mode() -> None:
    text = notes({"vllm": {"speculativeDecoding": {"enabled": True}}, "validation": {"enabled": True}})
    assert "MTP speculative decoding is on. It is NOT YET VALIDATED WITH LMCACHE" in text
    assert "UNSAFE FOR PRODUCTION" in text and "helm test glm53-flash" in text


def test_notes_say_what_dev_mode_opens_and_which_opt_ins_are_on() -> None:
    text = notes({"validation": {"enabled": True}, "profile": "glm53", "allowUnverified": {"fp8KvCache": True}})
    assert "/reset_prefix_cache, /collective_rpc, /sleep" in text
    assert "The NetworkPolicy admits that port only from the test pod and the namespaces monitoring." in text
    assert "WARNING: allowUnverified.fp8KvCache=true: this setting is not validated for GLM-5.3" in text
    assert "allowUnverified" not in notes({})
