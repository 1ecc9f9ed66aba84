"""``hpctrain schema``: the JSON Schema of job specs, for editor completion.

Point an editor at it, e.g. VS Code's YAML extension:
``# yaml-language-server: $schema=hpctrain-spec.schema.json``.
"""

from __future__ import annotations

import argparse
import json

from hpctrain.jobspec.models import JobSpec


def spec_schema() -> dict:
    schema = JobSpec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "hpctrain job spec"
    return schema


def run(args: argparse.Namespace) -> int:
    print(json.dumps(spec_schema(), indent=args.indent))
    return 0
