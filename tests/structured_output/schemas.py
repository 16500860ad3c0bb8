"""JSON schemas of the shapes clients send (nested objects, arrays with bounds, enums, bounded
numbers, optional fields, string formats), all with bounded output so that a tiny random model
under the grammar must finish inside the token budget: every output has to validate."""

from __future__ import annotations

NAME = {"type": "string", "minLength": 1, "maxLength": 8}

SCHEMAS: dict[str, dict] = {
    "person": {"type": "object", "properties": {
        "name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 130}},
        "required": ["name", "age"], "additionalProperties": False},
    "optional_fields": {"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 999},
        "nickname": NAME, "active": {"type": "boolean"}},
        "required": ["id"], "additionalProperties": False},
    "enum_status": {"type": "object", "properties": {
        "status": {"enum": ["open", "closed", "pending"]},
        "priority": {"type": "integer", "enum": [1, 2, 3]}},
        "required": ["status", "priority"], "additionalProperties": False},
    "tags_array": {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6},
                 "minItems": 1, "maxItems": 3}},
        "required": ["tags"], "additionalProperties": False},
    "nested_address": {"type": "object", "properties": {
        "user": {"type": "object", "properties": {
            "name": NAME,
            "address": {"type": "object", "properties": {
                "city": NAME, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"], "additionalProperties": False}},
            "required": ["name", "address"], "additionalProperties": False}},
        "required": ["user"], "additionalProperties": False},
    "bounded_number": {"type": "object", "properties": {
        "temperature": {"type": "number", "minimum": -50, "maximum": 60},
        "unit": {"enum": ["C", "F"]}},
        "required": ["temperature", "unit"], "additionalProperties": False},
    "array_of_objects": {"type": "object", "properties": {
        "items": {"type": "array", "minItems": 1, "maxItems": 2, "items": {
            "type": "object", "properties": {
                "sku": {"type": "string", "pattern": "^[A-Z]{3}[0-9]{2}$"},
                "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
            "required": ["sku", "qty"], "additionalProperties": False}}},
        "required": ["items"], "additionalProperties": False},
    "date_format": {"type": "object", "properties": {
        "day": {"type": "string", "format": "date"}},
        "required": ["day"], "additionalProperties": False},
    "uuid_format": {"type": "object", "properties": {
        "id": {"type": "string", "format": "uuid"}},
        "required": ["id"], "additionalProperties": False},
    "boolean_flags": {"type": "object", "properties": {
        "a": {"type": "boolean"}, "b": {"type": "boolean"}, "c": {"type": "null"}},
        "required": ["a", "b", "c"], "additionalProperties": False},
    "top_level_array": {"type": "array", "items": {"type": "integer", "minimum": 0,
                                                    "maximum": 99},
                        "minItems": 2, "maxItems": 4},
    "any_of": {"type": "object", "properties": {
        "value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9},
                            {"type": "string", "maxLength": 4}]}},
        "required": ["value"], "additionalProperties": False},
    "const_and_enum_mix": {"type": "object", "properties": {
        "kind": {"const": "event"}, "level": {"enum": ["low", "high", None]}},
        "required": ["kind", "level"], "additionalProperties": False},
    "refs": {"type": "object", "$defs": {"point": {"type": "object", "properties": {
        "x": {"type": "integer", "minimum": -9, "maximum": 9},
        "y": {"type": "integer", "minimum": -9, "maximum": 9}},
        "required": ["x", "y"], "additionalProperties": False}},
        "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}},
        "required": ["start", "end"], "additionalProperties": False},
    "tuple_prefix_items": {"type": "array", "prefixItems": [
        {"type": "string", "maxLength": 5}, {"type": "integer", "minimum": 0, "maximum": 50}],
        "items": False, "minItems": 2},
    "string_pattern_code": {"type": "object", "properties": {
        "code": {"type": "string", "pattern": "^[a-z]{2}-[0-9]{3}$"},
        "count": {"type": "integer", "minimum": 0, "maximum": 5}},
        "required": ["code", "count"], "additionalProperties": False},
    "exclusive_bounds": {"type": "object", "properties": {
        "score": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}},
        "required": ["score"], "additionalProperties": False},
}
