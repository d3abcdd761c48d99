"""The message list of OpenAI's cookbook token-counting example ("How to count tokens with
tiktoken"): the API reported 129 prompt tokens for gpt-3.5-turbo/gpt-4 and 124 for gpt-4o."""

from __future__ import annotations

from typing import Any

COOKBOOK: list[dict[str, Any]] = [
    {
        "role": "system",
        "content": "You are a helpful, pattern-following assistant that translates"
        " corporate jargon into plain English.",
    },
    {
        "role": "system",
        "name": "example_user",
        "content": "New synergies will help drive top-line growth.",
    },
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Things working well together will increase revenue.",
    },
    {
        "role": "system",
        "name": "example_user",
        "content": "Let's circle back when we have more"
        " bandwidth to touch base on opportunities for increased leverage.",
    },
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Let's talk later when we're less busy about how to do better.",
    },
    {
        "role": "user",
        "content": "This late pivot means we don't have time to boil the ocean for"
        " the client deliverable.",
    },
]
