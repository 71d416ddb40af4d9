"""The official openai SDK's usual calls against an OpenAI-compatible server, then structured outputs
(`chat.completions.parse` and its stream with a Pydantic model, `responses.parse`) and the Responses API
(`responses.create`, plain and streamed)."""

import sys
import typing

import openai
import pydantic

client = openai.OpenAI(base_url=sys.argv[1], api_key="unused")
model = sys.argv[2]
print("models:", [m.id for m in client.models.list().data], client.models.retrieve(model).id)
reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=8)
print("chat:", repr(reply.choices[0].message.content))
chunks = client.chat.completions.create(
    model=model,
    messages=[{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    stream=True,
    stream_options={"include_usage": True},
    max_tokens=8,
    seed=7,
    temperature=0.8,
    logprobs=True,
    top_logprobs=3,
)
print("chat stream usage:", [c.usage.completion_tokens for c in chunks if c.usage])
print(
    "completion:",
    repr(client.completions.create(model=model, prompt="Once upon", max_tokens=8, logprobs=2).choices[0].text),
)
many = client.completions.create(model=model, prompt=["Once upon", "In a"], max_tokens=4, n=2, temperature=1.0, seed=3)
print("completions n=2 × 2 prompts:", [c.index for c in many.choices])


class Pet(pydantic.BaseModel):
    """A closed answer: a structured output any model can be held to."""

    ok: bool
    pet: typing.Literal["cat", "dog"]


parsed = client.chat.completions.parse(
    model=model, messages=[{"role": "user", "content": "A pet?"}], response_format=Pet
)
print("chat.completions.parse:", parsed.choices[0].message.parsed)
with client.chat.completions.stream(
    model=model, messages=[{"role": "user", "content": "A pet?"}], response_format=Pet
) as s:
    print("chat.completions.stream parse:", s.get_final_completion().choices[0].message.parsed)
answer = client.responses.create(model=model, input="Hi", instructions="Be brief.", max_output_tokens=8)
print("responses.create:", answer.status, repr(answer.output_text), answer.usage.output_tokens)
events = [e.type for e in client.responses.create(model=model, input="Hi", max_output_tokens=8, stream=True)]
print("responses stream:", events[0], "…", events[-1], f"({len(events)} events)")
print("responses.parse:", client.responses.parse(model=model, input="A pet?", text_format=Pet).output_parsed)
