"""JSON schemas of real shapes with one valid instance each (compact separators ", " and
": ", as pagedllm's structured output writes JSON), for the structured-output benchmarks."""

from __future__ import annotations

import json

SCHEMAS: dict[str, dict] = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5}},
        "required": ["name", "age"], "additionalProperties": False},
    "order": {"type": "object", "properties": {
        "id": {"type": "string", "pattern": "^ORD-[0-9]{6}$"},
        "status": {"enum": ["new", "paid", "shipped", "cancelled"]},
        "items": {"type": "array", "minItems": 1, "items": {"type": "object", "properties": {
            "sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1},
            "price": {"type": "number", "minimum": 0}},
            "required": ["sku", "qty", "price"], "additionalProperties": False}},
        "note": {"type": "string"}},
        "required": ["id", "status", "items"], "additionalProperties": False},
    "event": {"type": "object", "properties": {
        "title": {"type": "string"}, "day": {"type": "string", "format": "date"},
        "location": {"type": "object", "properties": {
            "city": {"type": "string"}, "country": {"type": "string", "minLength": 2,
                                                    "maxLength": 2}},
            "required": ["city", "country"], "additionalProperties": False},
        "attendees": {"type": "integer", "minimum": 0}},
        "required": ["title", "day", "location"], "additionalProperties": False},
    "weather_call": {"type": "object", "properties": {
        "name": {"const": "get_weather"},
        "arguments": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 14}},
            "required": ["city", "unit"], "additionalProperties": False}},
        "required": ["name", "arguments"], "additionalProperties": False},
}

INSTANCES: dict[str, dict] = {
    "person": {"name": "Ada Lovelace", "age": 36, "email": "ada@example.org",
               "tags": ["math", "poetry", "engines"]},
    "order": {"id": "ORD-004217", "status": "paid", "items": [
        {"sku": "BOOK-1", "qty": 2, "price": 12.5}, {"sku": "PEN-77", "qty": 10, "price": 0.99}],
        "note": "leave at the front desk"},
    "event": {"title": "Annual meeting of the society", "day": "2026-03-14",
              "location": {"city": "Edinburgh", "country": "GB"}, "attendees": 120},
    "weather_call": {"name": "get_weather", "arguments": {
        "city": "San Francisco", "unit": "celsius", "days": 3}},
}

# Long outputs for throughput runs: an array that cannot close within the token budget, so
# every constrained row generates exactly max_tokens tokens like the free rows.
LONG_ARRAY = {"type": "array", "minItems": 100, "items": SCHEMAS["person"]}


def instance_text(name: str) -> str:
    return json.dumps(INSTANCES[name], separators=(", ", ": "), ensure_ascii=False)
