"""Sessions with a unique fact planted in every user message, for bench/retention.py.

Two generators written apart, with their own vocabulary, fact forms and message shapes: the
digest was tuned on `tuning` only; `held_out` (and facts planted in the recorded traces) are
only for reporting. Each returns the messages and the facts: one key per user message, a
string that is visible in a view exactly when the view still shows that fact.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Callable
from typing import Any

Message = dict[str, Any]
Session = tuple[list[Message], list[str]]

# -- tuning: a travel-support chat ------------------------------------------------------------

_TUNE_FILLER = (
    "Thanks for getting back to me so quickly.",
    "I have been trying to sort this out since yesterday.",
    "The app keeps logging me out, which is annoying.",
    "Let me know if you need anything else from my side.",
    "I am travelling with my family this time.",
    "It would be great to have this settled before the weekend.",
    "Sorry for the long message, I just want to be clear.",
    "I checked the website but could not find the answer.",
)
_TUNE_FACTS = (
    "My booking reference is {key}.",
    "The frequent flyer number on the account is {key}.",
    "Please send the receipt for order {key} to my work address.",
    "The seat I was given is row {key}, which is not what I paid for.",
    "My passport number ends in {key}.",
    "The hotel confirmation code is {key}.",
)
_TUNE_ANSWERS = (
    "I understand, and I am sorry for the trouble this has caused.",
    "Let me look into that for you right away.",
    "I can see your profile and the recent changes on it.",
    "There are a few options we can consider here.",
    "I have noted that on the file.",
    "The policy allows changes up to 24 hours before departure.",
    "I will check with the partner airline as well.",
    "Is there anything else you would like me to review today?",
)


def _code(rng: random.Random, used: set[str]) -> str:
    while True:
        key = "".join(rng.choices(string.ascii_uppercase + string.digits, k=6))
        if any(c.isdigit() for c in key) and key not in used:
            used.add(key)
            return key


def _tool_result(rng: random.Random, tokens: int) -> str:
    rows = [
        {"id": rng.randrange(10**6), "status": rng.choice(["ok", "pending", "void"]), "n": i}
        for i in range(max(1, tokens // 20))
    ]
    return json.dumps(rows)


def tuning(turns: int, seed: int, *, agent: bool = False) -> Session:
    """A support chat: each user message some chatter around one fact; the assistant answers
    with chatter; in an agent session it looks things up with tools first."""
    rng = random.Random(seed)
    used: set[str] = set()
    messages: list[Message] = [{"role": "system", "content": "You are an airline support agent."}]
    facts = []
    for turn in range(turns):
        key = _code(rng, used)
        facts.append(key)
        sentences = rng.sample(_TUNE_FILLER, rng.randint(2, 6))
        sentences.insert(rng.randint(0, len(sentences)), rng.choice(_TUNE_FACTS).format(key=key))
        messages.append({"role": "user", "content": " ".join(sentences)})
        if agent:
            for call in range(rng.randint(1, 2)):
                call_id = f"call_{turn}_{call}"
                arguments = json.dumps({"query": rng.choice(_TUNE_ANSWERS)[:20]})
                messages.append(
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": call_id,
                                "type": "function",
                                "function": {"name": "lookup", "arguments": arguments},
                            }
                        ],
                    }
                )
                result = _tool_result(rng, rng.randint(150, 600))
                messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
        answer = " ".join(rng.choices(_TUNE_ANSWERS, k=rng.randint(4, 12)))
        messages.append({"role": "assistant", "content": answer})
    return messages, facts


# -- held out: a renovation project, written separately ---------------------------------------

_ROOMS = ("kitchen", "hallway", "attic", "bathroom", "garage", "porch", "study", "laundry")
_MATERIALS = ("oak", "slate", "terracotta", "birch ply", "zinc", "lime plaster", "cork")
_PEOPLE = ("Okafor", "Lindqvist", "Tanaka", "Moreau", "Alvarez", "Kowalczyk", "Haddad")


def _held_out_fact(rng: random.Random, key: int) -> tuple[str, str]:
    """One fact sentence and the key that shows it, in one of several forms."""
    room, person = rng.choice(_ROOMS), rng.choice(_PEOPLE)
    forms: list[Callable[[], tuple[str, str]]] = [
        lambda: (f"the quote for the {room} came to ${key:,}", f"${key:,}"),
        lambda: (f"{person}'s crew can start on day {key} of the plan", f"day {key}"),
        lambda: (f"the permit we got is no. {key}", f"no. {key}"),
        lambda: (f"the {room} wall measures {key} mm", f"{key} mm"),
        lambda: (f"call the supplier on 0{key}", f"0{key}"),
        lambda: (f'we agreed to name the colour "Velm {key}"', f"Velm {key}"),
    ]
    return rng.choice(forms)()


_RAMBLE = (
    "honestly the whole thing is taking longer than we hoped and the neighbours keep "
    "asking when the noise will stop but we are still happy with how it looks so far "
    "and the dog has decided the dust sheets are his new bed which is fine I suppose"
)


def _ramble(rng: random.Random, words: int) -> str:
    pool = _RAMBLE.split()
    start = rng.randrange(len(pool))
    return " ".join(pool[(start + i) % len(pool)] for i in range(words))


def held_out(turns: int, seed: int, *, agent: bool = False) -> Session:
    """A homeowner and a project assistant: long rambling messages with the fact anywhere in
    them (often at the end), and long answers; in an agent session, file searches."""
    rng = random.Random(seed * 7919 + 17)
    messages: list[Message] = [
        {"role": "system", "content": "You help a homeowner run a renovation project."}
    ]
    facts = []
    keys = rng.sample(range(10_000, 100_000), turns)  # five digits: no key inside another
    for turn, key in enumerate(keys):
        sentence, shown = _held_out_fact(rng, key)
        facts.append(shown)
        before = _ramble(rng, rng.randint(10, 70))
        after = _ramble(rng, rng.randint(0, 30))
        text = f"{before}, oh and {sentence}. {after}".strip()
        messages.append({"role": "user", "content": text})
        if agent:
            call_id = f"search-{turn}"
            messages.append(
                {
                    "role": "assistant",
                    "content": "Searching the project folder.",
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {
                                "name": "search_files",
                                "arguments": json.dumps({"pattern": rng.choice(_MATERIALS)}),
                            },
                        }
                    ],
                }
            )
            hits = "\n".join(
                f"notes/{rng.choice(_ROOMS)}-{i}.md:{rng.randrange(400)}: {_ramble(rng, 12)}"
                for i in range(rng.randint(8, 30))
            )
            messages.append({"role": "tool", "tool_call_id": call_id, "content": hits})
        reply = f"Noted about the {rng.choice(_ROOMS)}. " + _ramble(rng, rng.randint(40, 160))
        messages.append({"role": "assistant", "content": reply})
    return messages, facts


# -- the recorded traces, with a fact planted in each user message -----------------------------


def traces(conversations: list[list[Message]], seed: int = 0) -> list[Session]:
    """Each recorded conversation with a held-out style fact added to every user message."""
    rng = random.Random(seed)
    keys = iter(rng.sample(range(100_000, 1_000_000), 10_000))
    sessions = []
    for conversation in conversations:
        messages, facts = [], []
        for message in conversation:
            if message["role"] == "user" and isinstance(message.get("content"), str):
                sentence, shown = _held_out_fact(rng, next(keys))
                message = {**message, "content": f"{message['content']} Also, {sentence}."}
                facts.append(shown)
            messages.append(message)
        sessions.append((messages, facts))
    return sessions


# -- the recorded traces, with a fact planted in each tool result ------------------------------

# What a tool may say that an agent needs later, each with a unique seven-digit number in it: a
# JSON field (inserted at a random place among the object's, or a record's) or a line of text.
_TOOL_FACTS = (
    ("voucher_code", "VCH-{key}"),
    ("case_number", "{key}"),
    ("refund_reference", "RF{key}"),
    ("agent_note", "customer was promised a callback about ticket {key}"),
    ("gate_change", "now departs from gate B{key}"),
    ("hold_until", "seat held under lock {key} for 24 hours"),
)


def _plant_in(value: Any, field: tuple[str, str], rng: random.Random) -> Any:
    """`value` (a JSON object or array) with the field inserted at a random place in it (an
    array's: in one of its objects, or as an item)."""
    if isinstance(value, dict):
        items = list(value.items())
        items.insert(rng.randint(0, len(items)), field)
        return dict(items)
    objects = [i for i, item in enumerate(value) if isinstance(item, dict)]
    if not objects:
        return [*value, dict([field])]
    at = rng.choice(objects)
    return [*value[:at], _plant_in(value[at], field, rng), *value[at + 1 :]]


def tool_facts(sessions: list[Session], seed: int = 0) -> list[tuple[list[Message], list[str]]]:
    """Each session with a fact planted in every tool result that is a JSON object or array,
    or text; the facts' keys (seven-digit numbers: no user fact of `traces` holds one)."""
    rng = random.Random(seed + 1)
    keys = iter(rng.sample(range(2_000_000, 10_000_000), 10_000))
    planted = []
    for messages, _ in sessions:
        out, facts = [], []
        for message in messages:
            content = message.get("content")
            if message["role"] == "tool" and isinstance(content, str):
                key = str(next(keys))
                name, form = rng.choice(_TOOL_FACTS)
                field = (name, form.format(key=key))
                try:
                    value = json.loads(content)
                except ValueError:
                    value = None
                if isinstance(value, dict | list):
                    content = json.dumps(_plant_in(value, field, rng))
                elif value is None:
                    lines = content.split("\n")
                    lines.insert(rng.randint(0, len(lines)), f"{name}: {field[1]}")
                    content = "\n".join(lines)
                if content is not message["content"]:  # a bare number or string: no fact
                    message = {**message, "content": content}
                    facts.append(key)
            out.append(message)
        planted.append((out, facts))
    return planted
