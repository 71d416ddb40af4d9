"""Structured outputs on the bundled model: 24 constraints (JSON schemas from Pydantic models, a JSON
object, regexes, choices, a grammar), submitted together so the engine runs them in shared batched steps,
greedy and sampled: every answer ends at an end token where its grammar ends and parses as its
constraint says (a schema's answer through Pydantic's own strict JSON parser), and every token event
carries its step's mask, with the first choice's verdict consistent with what was chosen."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from model_runner.protocol.constraint import Constraint
from model_runner.protocol.request import parse_generate

MAX_TOKENS = 160  # room for every answer below; an answer still open at this length fails the test


class City(BaseModel):
    name: str = Field(pattern=r"^[A-Z][a-z]{1,11}$")
    country: Literal["France", "Italy", "Spain", "Germany", "Other"]


class Verdict(BaseModel):
    correct: bool
    confidence: int = Field(ge=0, le=100)


class Colour(BaseModel):
    colour: Literal["red", "green", "blue"]
    hex: str = Field(pattern=r"^#[0-9a-f]{6}$")


class Person(BaseModel):
    first: str = Field(pattern=r"^[A-Z][a-z]{1,9}$")
    age: int = Field(ge=0, le=120)
    student: bool


class Point(BaseModel):
    x: int = Field(ge=-100, le=100)
    y: int = Field(ge=-100, le=100)


class Tags(BaseModel):
    tags: list[Literal["fruit", "red", "sweet", "green", "sour"]] = Field(min_length=1, max_length=3)


class Sentiment(BaseModel):
    label: Literal["positive", "negative", "neutral"]


class Answer(BaseModel):
    answer: int = Field(ge=0, le=1000)
    unit: Literal["km", "m", "kg", "none"]


def schema_of(model: type[BaseModel]) -> str:
    return json.dumps(model.model_json_schema() | {"additionalProperties": False})


def schema_case(prompt: str, model: type[BaseModel]):
    return prompt, Constraint("json_schema", schema_of(model), "f"), lambda text: model.model_validate_json(text)


def regex_case(prompt: str, pattern: str):
    return prompt, Constraint("regex", pattern, "f"), lambda text: re.fullmatch(pattern, text) or _fail(text)


def choice_case(prompt: str, choices: list[str]):
    return prompt, Constraint("choice", json.dumps(choices), "f"), lambda text: text in choices or _fail(text)


def _fail(text: str):
    raise AssertionError(f"no match: {text!r}")


def _object(text: str) -> dict:
    value = json.loads(text)
    assert isinstance(value, dict)
    return value


CASES = [
    schema_case("Give a European capital city as JSON.", City),
    schema_case("Is 2 + 2 = 5? Answer as JSON.", Verdict),
    schema_case("Name a colour and its hex code as JSON.", Colour),
    schema_case("Describe a made-up person as JSON.", Person),
    schema_case("Give a point on a grid as JSON.", Point),
    schema_case("Tag the word 'apple' as JSON.", Tags),
    schema_case("What is the sentiment of 'I love this!'? JSON.", Sentiment),
    schema_case("How far is it from Paris to Lyon? JSON.", Answer),
    ('Reply with the JSON object {"ok": true}.', Constraint("json_object", "", "f"), _object),
    ("Give a JSON object with a cat's name and age, nothing else.", Constraint("json_object", "", "f"), _object),
    regex_case("What year did World War II end?", r"(19|20)\d\d"),
    regex_case("Write a date.", r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"),
    regex_case("Give a phone number.", r"\+?\d{1,3}-\d{3}-\d{4}"),
    regex_case("Write an email address.", r"[a-z]{2,10}@[a-z]{2,10}\.(com|org|net)"),
    regex_case("Say yes or no, then why, briefly.", r"(Yes|No)\. [A-Za-z ,]{5,40}\."),
    regex_case("Give a time of day.", r"([01]\d|2[0-3]):[0-5]\d"),
    regex_case("Name a primary colour in capitals.", r"(RED|YELLOW|BLUE)"),
    regex_case("Give an IPv4 address.", r"(\d{1,3}\.){3}\d{1,3}"),
    choice_case("Is the sky blue?", ["yes", "no"]),
    choice_case("What is the capital of France?", ["Paris", "London", "Berlin", "Madrid"]),
    choice_case("Which is a fruit?", ["carrot", "apple", "potato"]),
    choice_case("Pick the largest planet.", ["Mercury", "Earth", "Jupiter"]),
    (
        "Give a simple addition.",
        Constraint("grammar", 'root ::= num " + " num " = " num\nnum ::= [1-9] [0-9]?', "f"),
        lambda text: re.fullmatch(r"[1-9]\d? \+ [1-9]\d? = [1-9]\d?", text) or _fail(text),
    ),
    choice_case("Rate this movie.", ["1 star", "2 stars", "3 stars", "4 stars", "5 stars"]),
]


def params_for(index: int, prompt: str, constraint: Constraint):
    sampling = {"temperature": 0} if index % 2 == 0 else {"temperature": 0.8, "seed": index}
    params = parse_generate(
        {"messages": [{"role": "user", "content": prompt}], "max_new_tokens": MAX_TOKENS, "sampling": sampling}
    )
    return dataclasses.replace(params, constraint=constraint)


@pytest.fixture(scope="module")
def answers(real_engine):
    handles = [
        real_engine.submit(params_for(i, prompt, constraint), f"so-{i}", label="test")
        for i, (prompt, constraint, _) in enumerate(CASES)
    ]
    return [[e.to_dict() for e in handle] for handle in handles]


def test_there_are_at_least_twenty_constraints_of_every_kind():
    assert len(CASES) >= 20
    assert {c.kind for _, c, _ in CASES} == {"json_schema", "json_object", "regex", "choice", "grammar"}


@pytest.mark.parametrize("index", range(len(CASES)))
def test_every_constrained_answer_ends_where_its_grammar_does_and_parses(answers, index):
    events = answers[index]
    finished = events[-1]
    assert finished["type"] == "finished", finished
    assert finished["reason"] == "eos", f"{CASES[index][0]!r}: {finished['reason']} after {finished['text']!r}"
    CASES[index][2](finished["text"])


def test_the_requests_shared_batched_steps(answers):
    sizes = [e["batch_size"] for run in answers for e in run if e["type"] == "token"]
    assert max(sizes) > 1


def test_every_token_event_carries_its_steps_mask_and_the_sampler_saw_only_that(answers):
    for index, run in enumerate(answers):
        tokens = [e for e in run if e["type"] == "token"]
        assert tokens and all(t["mask"]["allowed"] >= 1 for t in tokens)
        # One token allowed: the masked distribution puts all its mass there.
        assert all(t["prob"] == 1.0 for t in tokens if t["mask"]["allowed"] == 1)
        if index % 2 == 0:  # greedy: the choice is the likeliest allowed token
            assert all(t["id"] == t["candidates"][0]["id"] for t in tokens)
