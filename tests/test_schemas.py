"""The published JSON Schemas (bundlegen/schemas/): each file is what its builder gives now,
a valid draft 2020-12 schema, shipped as package data, and says yes and no where its loader
does (bundlegen.toml, lanes.yaml; the [[test_skips]] row: tests/test_harness_config.py)."""
from __future__ import annotations

import fnmatch
import json
import textwrap
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml

from bundlegen.harness.lanes import LanesError, load_lanes
from bundlegen.harness.schema_files import SCHEMAS, schema_dir, schema_text
from bundlegen.workspace import WorkspaceError, find_workspace

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_the_published_schema_is_its_builders_and_valid(name):
    path = schema_dir() / name
    assert path.read_text(encoding="utf-8") == schema_text(name), \
        f"{path} is stale: python -m bundlegen.harness.schema_files"
    jsonschema.Draft202012Validator.check_schema(json.loads(path.read_text(encoding="utf-8")))


def test_the_schemas_are_package_data():
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["bundlegen"]
    for name in SCHEMAS:
        assert any(fnmatch.fnmatch(f"schemas/{name}", pattern) for pattern in data), name


def schema(name: str) -> jsonschema.Validator:
    return jsonschema.Draft202012Validator(json.loads((schema_dir() / name).read_text(encoding="utf-8")))


WORKSPACES = [
    'engines = ["bundlegen-engines"]',
    'plans = ["myproj.plan", "bundlegen.plans.sdpa_bwd"]\nbundles = "b"\nengines = ["e"]\nlanes = "l.yaml"\nmatrix = "M.md"',
    "",
    'colour = "red"', "engines = []", 'engines = "e"', 'plans = ["my-plan"]', "plans = [1]", 'bundles = ""',
    "bundles = 3", 'matrix = ["M.md"]',
]


@pytest.mark.parametrize("text", WORKSPACES)
def test_bundlegen_toml_schema_and_loader_agree(tmp_path, text):
    (tmp_path / "bundlegen.toml").write_text(text + "\n")
    try:
        find_workspace(tmp_path)
        loads = True
    except WorkspaceError:
        loads = False
    assert schema("bundlegen-toml.schema.json").is_valid(tomllib.loads(text)) is loads


LANE = "engine: torch-math, device: cpu, level: quick"
LANES = [
    f"lanes: {{a: {{{LANE}}}}}",
    f"lanes: {{a-1: {{{LANE}, shards: 4, timeout: 1.5, keep: [results, report], runner: [self-hosted, h200], "
    "arch: sm90, devices: 'cpu,cpu', workers_per_device: 2, description: x}}",
    f"install: [pip install .]\nlock: [req.txt]\nlanes: {{a: {{{LANE}}}}}",
    f"lanes: {{a: {{{LANE}, skips: [{{filters: {{item: AX-FOO*}}, reason: 'PROJ-1: x'}}]}}}}",
    "lanes: {}", "lanes: []", f"colour: red\nlanes: {{a: {{{LANE}}}}}", f"install: []\nlanes: {{a: {{{LANE}}}}}",
    f"install: pip install .\nlanes: {{a: {{{LANE}}}}}", f"lock: ['']\nlanes: {{a: {{{LANE}}}}}",
    f"lanes: {{A: {{{LANE}}}}}", "lanes: {a: {engine: torch-math, device: cpu}}",
    f"lanes: {{a: {{{LANE}, colour: red}}}}", f"lanes: {{a: {{{LANE}, shards: 0}}}}",
    f"lanes: {{a: {{{LANE}, shards: true}}}}", f"lanes: {{a: {{{LANE}, timeout: 0}}}}",
    f"lanes: {{a: {{{LANE}, keep: [everything]}}}}", f"lanes: {{a: {{{LANE}, mps: yes-please}}}}",
    "lanes: {a: {engine: torch-math, device: gpu, level: quick}}", f"lanes: {{a: {{{LANE}, runner: []}}}}",
    f"lanes: {{a: {{{LANE}, engine: ' '}}}}", f"lanes: {{a: {{{LANE}, skips: [{{reason: x}}]}}}}",
    f"lanes: {{a: {{{LANE}, workers_per_device: 0}}}}",
]


@pytest.mark.parametrize("text", LANES)
def test_lanes_yaml_schema_and_loader_agree(tmp_path, text):
    path = tmp_path / "lanes.yaml"
    path.write_text(textwrap.dedent(text) + "\n")
    try:
        load_lanes(path)
        loads = True
    except LanesError:
        loads = False
    assert schema("lanes-yaml.schema.json").is_valid(yaml.safe_load(path.read_text())) is loads


def test_the_repositorys_own_files_pass_their_schemas():
    schema("lanes-yaml.schema.json").validate(yaml.safe_load((REPO / "lanes.yaml").read_text()))
    table = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["bundlegen"]
    schema("bundlegen-toml.schema.json").validate(table)
