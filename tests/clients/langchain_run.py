"""LangChain's ChatOpenAI and OpenAI (completions) against an OpenAI-compatible server in their default
setup (built with only the base URL, a key and the model): invoke, stream and batch each, and
ChatOpenAI's with_structured_output with a Pydantic model."""

import sys
import typing

import pydantic
from langchain_openai import ChatOpenAI, OpenAI

base, model = sys.argv[1], sys.argv[2]
chat = ChatOpenAI(base_url=base, api_key="unused", model=model)
llm = OpenAI(base_url=base, api_key="unused", model=model)
print("ChatOpenAI.invoke:", repr(chat.invoke("Name a colour. One word.").content))
print("ChatOpenAI.stream:", repr("".join(c.content for c in chat.stream("Name a fruit. One word."))))
print("ChatOpenAI.batch:", [m.content for m in chat.batch(["Name a tree. One word.", "Name a bird. One word."])])
print("OpenAI.invoke:", repr(llm.invoke("The capital of France is")))
print("OpenAI.stream:", repr("".join(llm.stream("The capital of Italy is"))))
print("OpenAI.batch:", llm.batch(["One, two, three,", "Red, green,"]))


class Pet(pydantic.BaseModel):
    """A closed answer: a structured output any model can be held to."""

    ok: bool
    pet: typing.Literal["cat", "dog"]


# with_structured_output's default (json_schema): response_format with the model's strict schema.
print("ChatOpenAI.with_structured_output:", chat.with_structured_output(Pet).invoke("Do you like a cat or a dog?"))
