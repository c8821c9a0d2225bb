"""Schemathesis hooks for the OpenAPI test (loaded through SCHEMATHESIS_HOOKS).

JSON Schema counts `8.0` as an integer; the API takes integer literals only
(`"top_k": 5.0` is refused with INVALID_BODY: `metis_indexer.schema` parses strictly). So a
case meant to be valid sends its integral floats as integers; negative cases are untouched.
"""

from __future__ import annotations

from typing import Any

import schemathesis


@schemathesis.hook
def map_case(context: Any, case: Any) -> Any:
    meta = case.meta
    if meta is not None and meta.generation.mode.is_positive and isinstance(case.body, dict):
        case.body = {
            k: int(v) if isinstance(v, float) and v.is_integer() else v
            for k, v in case.body.items()
        }
    return case
