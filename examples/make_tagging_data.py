#!/usr/bin/env python3
"""Writes the demo's example personal dataset: short notes from a phone's inbox, each tagged
with one of five labels. Deterministic (fixed seed). Train and test use the same templates
but disjoint filler combinations, so held-out accuracy measures generalisation to new notes.

    python3 examples/make_tagging_data.py   # rewrites examples/tagging-train.jsonl, -test.jsonl
                                            # and the chat versions tagging-chat-train/-test.jsonl
"""
import json
import os
import random

TAGS = {
    "work": (["meeting", "deadline", "report", "client", "invoice", "slides", "standup", "review"],
             ["Move the {w} to {d}", "Send the {w} before {d}", "{p} asked about the {w}", "Prepare the {w} for {d}",
              "Can we push the {w} to {d}?"]),
    "family": (["mom", "dad", "grandma", "sister", "brother", "the kids", "uncle Joe", "aunt May"],
               ["Call {w} on {d}", "Dinner with {w} on {d}", "{w} says hi", "Pick up {w} after school on {d}",
                "Birthday gift for {w}"]),
    "shopping": (["milk", "eggs", "bread", "coffee", "rice", "apples", "soap", "batteries"],
                 ["Buy {w} and more {w2}", "We are out of {w}", "Get {w} on the way home", "Order {w} online",
                  "Add {w} to the list", "Pick up {w} at the store on {d}", "Is {w} on sale {d}?"]),
    "travel": (["flight", "hotel", "train", "passport", "boarding pass", "rental car", "visa", "luggage"],
               ["Check in for the {w} on {d}", "Book the {w} for {d}", "The {w} leaves at {t}", "Renew the {w} before {d}",
                "Confirm the {w} to Lisbon"]),
    "health": (["dentist", "doctor", "pharmacy", "gym", "vitamins", "blood test", "physio", "eye exam"],
               ["Appointment with the {w} on {d}", "Refill at the {w}", "Go to the {w} at {t}", "Book the {w} for {d}",
                "Reminder: {w} tomorrow"]),
}
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday", "next week"]
TIMES = ["7am", "9:30", "noon", "3pm", "6pm", "8:15"]
PEOPLE = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima"]
LABELS = list(TAGS)
SYSTEM = {"role": "system", "content": "Tag the user's note with one word: " + ", ".join(LABELS[:-1]) + " or " + LABELS[-1] + "."}


def note(rng, tag):
    words, templates = TAGS[tag]
    t = rng.choice(templates)
    return t.format(w=rng.choice(words), w2=rng.choice(words), d=rng.choice(DAYS), t=rng.choice(TIMES),
                    p=rng.choice(PEOPLE))


def main():
    rng = random.Random(20261129)
    seen = set()
    rows = []
    while len(rows) < 560:  # every tag has more than 112 distinct notes
        tag = LABELS[len(rows) % len(LABELS)]
        text = note(rng, tag)
        if text in seen:
            continue
        seen.add(text)
        rows.append((text, tag))
    rng.shuffle(rows)
    here = os.path.dirname(os.path.abspath(__file__))
    train, test = rows[:440], rows[440:]
    with open(os.path.join(here, "tagging-train.jsonl"), "w") as f:
        for text, tag in train:
            f.write(json.dumps({"prompt": "Note: " + text + "\nTag:", "completion": " " + tag}) + "\n")
    with open(os.path.join(here, "tagging-test.jsonl"), "w") as f:
        for text, tag in test:
            f.write(json.dumps({"prompt": "Note: " + text + "\nTag:", "choices": [" " + l for l in LABELS],
                                "answer": " " + tag}) + "\n")
    # the same notes as conversations, for an instruction-tuned model's own chat template
    with open(os.path.join(here, "tagging-chat-train.jsonl"), "w") as f:
        for text, tag in train:
            f.write(json.dumps({"messages": [SYSTEM, {"role": "user", "content": text},
                                             {"role": "assistant", "content": tag}]}) + "\n")
    with open(os.path.join(here, "tagging-chat-test.jsonl"), "w") as f:
        for text, tag in test:
            f.write(json.dumps({"messages": [SYSTEM, {"role": "user", "content": text}], "choices": LABELS,
                                "answer": tag}) + "\n")


if __name__ == "__main__":
    main()
