"""The official openai SDK's usual calls against an OpenAI-compatible server."""

import sys

import openai

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
