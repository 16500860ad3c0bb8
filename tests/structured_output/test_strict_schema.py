"""close_objects: which object schemas it closes, and that the compiled grammar then refuses
an undeclared key the schema-as-written allows."""

from __future__ import annotations

import pytest

from pagedllm.structured_output.backend import GrammarCompiler
from pagedllm.structured_output.params import StructuredOutputsParams
from pagedllm.structured_output.strict_schema import close_objects

OPEN = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
}


def test_closes_every_object_with_properties():
    schema = {
        "type": "object",
        "properties": {
            "properties": {"type": "object", "properties": {"a": {"type": "integer"}}},
            "list": {"type": "array", "items": {"properties": {"b": {}}}},
            "either": {"anyOf": [{"properties": {"c": {}}}, {"type": "null"}]},
            "free": {"type": "object"},
            "open": {"properties": {"d": {}}, "additionalProperties": True},
        },
        "$defs": {"Pet": {"properties": {"name": {}}}},
    }
    out = close_objects(schema)
    props = out["properties"]
    assert out["additionalProperties"] is False
    # a property named "properties" is a schema, its map is not given a keyword
    assert props["properties"]["additionalProperties"] is False
    assert "additionalProperties" not in props["properties"]["properties"]
    assert props["list"]["items"]["additionalProperties"] is False
    assert props["either"]["anyOf"][0]["additionalProperties"] is False
    assert "additionalProperties" not in props["free"]  # no declared keys: stays free-form
    assert props["open"]["additionalProperties"] is True  # an explicit choice is kept
    assert out["$defs"]["Pet"]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # the input is not modified


def test_allof_branches_stay_open_but_their_children_close():
    schema = {
        "allOf": [
            {"properties": {"a": {"type": "object", "properties": {"x": {}}}}},
            {"properties": {"b": {}}},
        ]
    }
    out = close_objects(schema)
    first, second = out["allOf"]
    assert "additionalProperties" not in first and "additionalProperties" not in second
    assert first["properties"]["a"]["additionalProperties"] is False


def test_string_schema_and_booleans():
    assert close_objects('{"properties": {"a": {}}}') == {
        "properties": {"a": {}},
        "additionalProperties": False,
    }
    assert close_objects(True) is True


def _accepts(compiler: GrammarCompiler, tokenizer, schema: dict, text: str) -> bool:
    grammar = compiler.grammar(StructuredOutputsParams(json=schema))
    ids = tokenizer.encode(text, add_special_tokens=False)
    return all(grammar.accept(t) for t in ids)


@pytest.mark.parametrize(
    ("text", "as_written", "closed"),
    [
        ('{"city": "Paris", "unit": "c"}', True, True),
        ('{"city": "Paris", "unit": "c", "weather": "sunny"}', True, False),
    ],
)
def test_compiled_grammar_refuses_undeclared_keys(tiny_tokenizer, text, as_written, closed):
    compiler = GrammarCompiler(tiny_tokenizer, len(tiny_tokenizer), tiny_tokenizer.eos_token_id)
    assert _accepts(compiler, tiny_tokenizer, OPEN, text) is as_written
    assert _accepts(compiler, tiny_tokenizer, close_objects(OPEN), text) is closed
