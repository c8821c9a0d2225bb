"""Which changes of a CRD's schema break what the one before accepted
(docs/reference/changing-the-resource.md): within `v1` only additive, defaulted changes.
A stored object the old schema took must still be taken, read the same, by the new one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

LOWER = ("minimum", "minLength", "minItems", "minProperties")
UPPER = ("maximum", "maxLength", "maxItems", "maxProperties")
SAME = ("type", "format", "pattern", "default", "x-kubernetes-int-or-string")
SCALARS = {"string", "integer", "number", "boolean"}
HOLDS_FOR_WHAT_WAS_TAKEN = {
    "has(self.drive) != has(self.flux)": "every source stored before has a drive (then "
    "required) and no flux (then unknown to the schema)",
    "self.all(a, self.filter(b, (has(b.drive) ? b.drive : b.flux.name) == "
    "(has(a.drive) ? a.drive : a.flux.name) && (!has(a.path) || !has(b.path) || "
    "a.path == b.path || b.path.startsWith(a.path + '/') || "
    "a.path.startsWith(b.path + '/'))).size() == 1)": "the rule before, `b.drive == a.drive`, "
    "where every source stored before has a drive: the same verdict for each of them",
}
"""New CEL rules that hold for every object a released schema took, each with why. Read
by hand, not derived: a rule is added here only with its reason, and the test names
every other new rule."""


def schema(crd: Mapping[str, Any], version: str = "v1") -> Mapping[str, Any]:
    [served] = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return served["schema"]["openAPIV3Schema"]


def breaking(
    old: Mapping[str, Any], new: Mapping[str, Any], where: str = "", defaulted: bool = False
) -> list[str]:
    """What `new` refuses, or reads otherwise, of what `old` took, one line each, named by
    path; `defaulted`: a field new here must carry a default (under `spec`, where an absent
    field must keep meaning what it meant)."""
    at = where or "(root)"
    out = [
        f"{at}: {key} {old.get(key)!r} became {new.get(key)!r}"
        for key in SAME
        if old.get(key) != new.get(key)
    ]
    for key in LOWER:
        if key in new and new[key] > old.get(key, new[key] - 1):
            out.append(f"{at}: {key} raised to {new[key]}")
    for key in UPPER:
        if key in new and new[key] < old.get(key, new[key] + 1):
            out.append(f"{at}: {key} lowered to {new[key]}")
    if old.get("nullable") and not new.get("nullable"):
        out.append(f"{at}: null no longer allowed")
    if "enum" in new and ("enum" not in old or not set(old["enum"]) <= set(new["enum"])):
        out.append(f"{at}: enum narrowed to {new['enum']}")
    rules = {r["rule"] for r in old.get("x-kubernetes-validations", [])}
    out += [
        f"{at}: a new rule {r['rule']!r}"
        for r in new.get("x-kubernetes-validations", [])
        if r["rule"] not in rules and r["rule"] not in HOLDS_FOR_WHAT_WAS_TAKEN
    ]
    before, after = old.get("properties", {}), new.get("properties", {})
    for name in sorted(set(new.get("required", [])) - set(old.get("required", []))):
        if "default" not in after.get(name, {}):
            out.append(f"{where}.{name}: required now, without a default")
    for name, node in before.items():
        if name not in after:
            out.append(f"{where}.{name}: removed")
        else:
            out += breaking(node, after[name], f"{where}.{name}", defaulted or name == "spec")
    if defaulted:
        out += [
            f"{where}.{name}: a new field without a default"
            for name, node in after.items()
            if name not in before and node.get("type") in SCALARS and "default" not in node
        ]
    for key, suffix in (("items", "[]"), ("additionalProperties", ".*")):
        if isinstance(old.get(key), Mapping) and isinstance(new.get(key), Mapping):
            out += breaking(old[key], new[key], where + suffix, defaulted)
        elif key in old and old.get(key) != new.get(key):
            out.append(f"{at}: {key} changed")
    return out
