"""Security scan of the rendered manifests: every checkov finding is fixed, or skipped with a reason in the README.

The README's skip table is the skip list: one scan without skips must fail exactly the documented checks, so a fix
that makes a skip unnecessary (or a new finding) shows up here.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.chartkit import CHART_DIR, NEWER_KUBE_RENDERS, render_cli, scenario_values, scenarios, tool

_SKIPS = re.compile(r"<!-- checkov-skips:start -->(.*?)<!-- checkov-skips:end -->", re.S)
_ROW = re.compile(r"^\| (CKV_[A-Z0-9_]+) \| ([^|]+) \| ([^|]+) \|$", re.M)


def documented_skips() -> dict[str, str]:
    """check id -> justification, from the chart README's skip table."""
    match = _SKIPS.search((CHART_DIR / "README.md").read_text())
    assert match, "charts/glm53/README.md lacks its checkov-skips table"
    return {check: why.strip() for check, _, why in _ROW.findall(match.group(1))}


def test_every_skip_is_justified() -> None:
    skips = documented_skips()
    assert skips, "the skip table parsed to nothing"
    for check, why in skips.items():
        assert len(why.split()) >= 8, f"{check}: justification too short: {why!r}"


@pytest.mark.slow
def test_checkov_fails_only_the_documented_checks(tmp_path: Path) -> None:
    checkov = tool("checkov")
    for name in scenarios():
        manifests = render_cli(scenario_values(name))
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump_all(manifests, sort_keys=False))
    for name, (values, kube_version) in NEWER_KUBE_RENDERS.items():
        manifests = render_cli(values, kube_version)
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump_all(manifests, sort_keys=False))
    # --skip-download: offline, no guideline download.
    command = [checkov, "-d", str(tmp_path), "--framework", "kubernetes", "--quiet", "-o", "json", "--skip-download"]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.stdout.strip(), f"checkov printed nothing: {done.stderr[-2000:]}"
    report = json.loads(done.stdout)
    failed = report["results"]["failed_checks"]
    found = {f["check_id"] for f in failed}
    details = sorted({f"{f['check_id']} {f['resource']}" for f in failed if f["check_id"] not in documented_skips()})
    assert found == set(documented_skips()), f"undocumented findings: {details}; stale skips: " + str(
        sorted(set(documented_skips()) - found)
    )
    assert report["summary"]["passed"] > 100
