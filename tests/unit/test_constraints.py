"""model_runner/shared/constraints.py on the fake model's byte tokenizer: a Guide's mask leaves the
allowed tokens' logits exactly as they were and makes every other token -inf, says how many it allowed
and whether the model's first choice was one; drawn at random under the mask, every answer matches its
regex, choice or schema and ends at an end token; what xgrammar refuses is a UserError naming the field."""

from __future__ import annotations

import json
import re

import pytest
import torch

from model_runner.protocol.constraint import Constraint, make_constraint
from model_runner.protocol.errors import UserError
from model_runner.shared.constraints import Guide, allowed_tokens, compiled
from model_runner.text.tokenizer import ByteTokenizer

TOK = ByteTokenizer()
VOCAB = ByteTokenizer.vocab_size


def guide(kind: str, spec: str) -> Guide:
    return Guide(compiled(Constraint(kind, spec, "response_format"), TOK, VOCAB), VOCAB)


CLOSERS = [ord(c) for c in '"}]'] + sorted(ByteTokenizer().eos_ids)  # favoured, so random answers end soon


def draw(g: Guide, seed: int, limit: int = 400) -> tuple[bytes, list]:
    """Sample under the mask from random logits (closing tokens favoured) until an end token; the
    bytes and each step's facts."""
    gen, out, facts = torch.Generator().manual_seed(seed), b"", []
    for _ in range(limit):
        logits = torch.randn(VOCAB, generator=gen) * 2
        logits[CLOSERS] += 6.0
        logits = g.apply(logits)
        facts.append(g.last)
        token = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
        g.accept(token)
        if token in TOK.eos_ids:
            return out, facts
        out += TOK.token_bytes(token)
    raise AssertionError(f"no end token within {limit} steps: {out!r}")


def test_the_mask_keeps_allowed_logits_bit_exact_and_forbids_the_rest():
    g = guide("choice", json.dumps(["yes", "no"]))
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(0))
    before = logits.clone()
    g.apply(logits)
    allowed = {ord("y"), ord("n")}
    assert {i for i in range(VOCAB) if logits[i] > float("-inf")} == allowed
    assert all(logits[i].item() == before[i].item() for i in allowed)
    assert g.last.allowed == 2


def test_first_allowed_says_whether_the_models_top_token_survived():
    g = guide("choice", json.dumps(["yes", "no"]))
    logits = torch.zeros(VOCAB)
    logits[ord("n")] = 5.0
    g.apply(logits)
    assert g.last.first_allowed is True
    g = guide("choice", json.dumps(["yes", "no"]))
    logits = torch.zeros(VOCAB)
    logits[ord("x")] = 5.0
    g.apply(logits)
    assert g.last.first_allowed is False and g.last.allowed == 2


def test_a_finished_grammar_allows_only_the_end_tokens():
    g = guide("choice", json.dumps(["ok"]))
    for byte in b"ok":
        g.apply(torch.zeros(VOCAB))
        g.accept(byte)
    g.apply(torch.zeros(VOCAB))
    assert g.last.allowed == len(TOK.eos_ids)
    assert not g.complete


def test_special_tokens_are_never_allowed_inside_a_grammar():
    g = guide("json_object", "")
    logits = torch.zeros(VOCAB)
    g.apply(logits)
    assert logits[ByteTokenizer.IM_START] == float("-inf") and logits[ByteTokenizer.IM_END] == float("-inf")


@pytest.mark.parametrize("seed", range(8))
def test_random_draws_under_a_regex_always_match_it(seed):
    pattern = r"[a-c]{2,5}-\d{1,3}"
    text, facts = draw(guide("regex", pattern), seed)
    assert re.fullmatch(pattern, text.decode()), text
    assert all(f.allowed >= 1 for f in facts)


@pytest.mark.parametrize("seed", range(8))
def test_random_draws_under_a_schema_always_parse_and_validate(seed):
    schema = {
        "type": "object",
        # No maxLength: xgrammar's length-bounded string admits raw control characters, which strict JSON refuses.
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "pet": {"enum": ["cat", "dog"]}},
        "required": ["name", "age", "pet"],
        "additionalProperties": False,
    }
    text, _ = draw(guide("json_schema", json.dumps(schema)), seed)
    value = json.loads(text)
    assert set(value) == {"name", "age", "pet"} and isinstance(value["age"], int) and value["pet"] in ("cat", "dog")


@pytest.mark.parametrize("seed", range(4))
def test_random_draws_under_json_object_parse_as_an_object(seed):
    text, _ = draw(guide("json_object", ""), seed)
    assert isinstance(json.loads(text), dict)


def test_allowed_tokens_unpacks_bit_j_of_word_w_as_token_32w_plus_j():
    mask = torch.tensor([-(2**31) | 1, 1 << 2], dtype=torch.int32)  # bits 0 and 31; bit 2
    assert allowed_tokens(mask, 40).nonzero().flatten().tolist() == [0, 31, 34]


def accepts(g: Guide, text: str) -> bool:
    """Whether the grammar takes `text` whole and may end there (an end token is taken only then)."""
    return g.matcher.accept_string(text) and g.matcher.accept_token(min(TOK.eos_ids))


def test_a_schema_s_answer_keeps_its_properties_in_the_order_the_client_listed_them():
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}
    schema["required"] = ["name", "age"]
    spec = make_constraint("json_schema", schema, "response_format.json_schema.schema").spec
    assert list(json.loads(spec)["properties"]) == ["name", "age"]
    assert accepts(guide("json_schema", spec), '{"name": "a", "age": 1}')
    assert not accepts(guide("json_schema", spec), '{"age": 1, "name": "a"}')


@pytest.mark.parametrize(
    "schema, words",
    [
        ({"allOf": [{"type": "string"}, {"enum": ["yes", "no"]}]}, "allOf with more than one schema at its root"),
        ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems at its root"),
        (
            {"type": "object", "properties": {"code": {"type": "string", "pattern": "a+", "maxLength": 3}}},
            "pattern beside minLength/maxLength at /properties/code",
        ),
        ({"$defs": {"tags": {"type": "array", "uniqueItems": True}}}, "uniqueItems at /$defs/tags"),
    ],
)
def test_keywords_xgrammar_would_ignore_are_refused_before_compiling_naming_the_field(schema, words):
    with pytest.raises(UserError) as caught:
        compiled(make_constraint("json_schema", schema, "response_format.json_schema.schema"), TOK, VOCAB)
    assert caught.value.field == "response_format.json_schema.schema" and words in caught.value.message


def test_keywords_xgrammar_enforces_and_property_names_like_keywords_are_taken():
    schema = {"type": "object", "properties": {"pattern": {"type": "string", "maxLength": 3}}}
    schema["$defs"] = {"one": {"allOf": [{"type": "string"}]}, "list": {"type": "array", "uniqueItems": False}}
    assert compiled(make_constraint("json_schema", schema, "f"), TOK, VOCAB) is not None


@pytest.mark.parametrize(
    "kind, spec",
    [("json_schema", '{"type": "nonsense"}'), ("json_schema", "{"), ("regex", "("), ("grammar", "root ::= ")],
)
def test_what_xgrammar_refuses_names_the_field(kind, spec):
    with pytest.raises(UserError) as caught:
        compiled(Constraint(kind, spec, "response_format.json_schema.schema"), TOK, VOCAB)
    assert caught.value.field == "response_format.json_schema.schema"
    assert "cannot be compiled" in caught.value.message and "/project/" not in caught.value.message
