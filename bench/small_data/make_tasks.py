#!/usr/bin/env python3
"""Writes the two small labelled tasks of the small-data defaults study (bench/small_data_defaults.sh):
short messages a person would keep on a phone, each with one label, as a train file and a
held-out test file whose lines carry the labels as choices (docs/formats.md: eval scores the
answer against the other choices). Deterministic (fixed seed): train and test share the
templates but no message.

  support  300 train / 100 test, 6 labels, prompt/completion  ("Ticket: ...\\nQueue:" -> " billing")
  reply    160 train /  60 test, 4 labels, chat messages      (system + user -> "urgent")

    python3 bench/small_data/make_tasks.py [OUTDIR]   # default: bench/small_data
"""
import json
import os
import random
import sys

# support: a help-desk ticket routed to its queue
SUPPORT = {
    "billing": (["invoice", "card", "charge", "subscription", "receipt", "payment", "plan", "bill"],
                ["I was charged twice for my {w}", "Why is my {w} higher this month?", "Please update the {w} on file",
                 "The {w} from {m} looks wrong", "Can I get a copy of the {w} for {m}?", "My {w} failed again"]),
    "shipping": (["parcel", "package", "order", "box", "delivery", "courier", "shipment", "tracking number"],
                 ["Where is my {w}?", "The {w} has not arrived since {m}", "The {w} went to the wrong address",
                  "Can the {w} come on {d} instead?", "The {w} says delivered but nothing is here", "How long does the {w} take to {c}?"]),
    "account": (["password", "login", "email address", "username", "two-factor code", "profile", "account", "phone number"],
                ["I cannot reset my {w}", "How do I change my {w} on {p}?", "I am locked out since {m}, the {w} changed",
                 "Please delete my {w}", "The {w} link never arrives on my {p}", "Someone else may be using my {w}"]),
    "returns": (["shoes", "jacket", "blender", "lamp", "headphones", "chair", "dress", "kettle"],
                ["I want to send back the {w}", "The {w} arrived broken, can I return it?", "How do I return the {w}?",
                 "The {w} is the wrong size, I need an exchange", "Still waiting for the refund on the {w}",
                 "Can I return the {w} after {n} days?"]),
    "bug": (["app", "checkout page", "search bar", "map", "camera upload", "dark mode", "login screen", "cart"],
            ["The {w} crashes when I tap it", "The {w} shows an error since the update", "The {w} freezes on {p}",
             "Nothing happens when I open the {w}", "The {w} is blank on my {p}", "The {w} keeps logging me out"]),
    "feature": (["widget", "export to CSV", "offline mode", "shared lists", "a calendar view", "dark theme", "gift cards",
                 "voice search"],
                ["Please add {w}", "It would be great to have {w}", "Any plans for {w}?", "Could you support {w} on {p}?",
                 "I would pay for {w}", "My team needs {w}"]),
}
MONTHS = ["March", "April", "May", "June", "last week", "yesterday"]
DAYS = ["Monday", "Tuesday", "Friday", "Saturday", "the weekend"]
CITIES = ["Porto", "Leeds", "Lyon", "Austin", "Osaka"]
PHONES = ["iPhone", "Android", "tablet", "laptop", "Pixel"]
NDAYS = ["10", "30", "45", "60"]

# reply: a message from family or friends, and how soon it needs an answer
REPLY = {
    "urgent": (["the car", "grandpa", "the dog", "the kitchen", "my wallet", "the baby", "the keys", "the basement"],
               ["Call me now, {w} is not okay", "{n}, come home quick, {w} needs you", "Emergency with {w}, answer please",
                "Need help right now with {w}", "{n}, pick up the phone, it's about {w}", "Hurry {n}, {w} can't wait"]),
    "today": (["dinner", "the kids", "groceries", "the package", "the recital", "soccer practice", "the plumber", "lunch"],
              ["Can you grab {w} before {t}?", "Are you free for {w} at {t}?", "Don't forget {w} at {t}",
               "Who is handling {w} at {t}?", "Let me know about {w} by {t}"]),
    "later": (["the trip", "the holidays", "the wedding", "the new couch", "the garden", "the summer", "the reunion",
               "the budget"],
              ["Some time this month, can we talk about {w}?", "No rush {n}, thoughts on {w}?", "When you have a minute, ideas for {w}?",
               "Whenever, we should plan {w}", "Next week let's look at {w} with {n}"]),
    "none": (["a photo of the beach", "the game score", "a funny video", "a recipe", "the new song", "the sunset",
              "an old picture", "the news"],
             ["Look at {w}!", "Just sharing {w}", "Haha, {n} sent {w}", "FYI: {w}", "Thought you'd like {w}, {n}"]),
}
NAMES = ["Sam", "Mia", "Leo", "Ava", "Noah", "Zoe"]
TIMES = ["5pm", "noon", "6:30", "tonight", "3pm", "8pm"]
REPLY_SYSTEM = {"role": "system",
                "content": "How soon does this message need a reply? Answer with one word: urgent, today, later or none."}


def make(tags, fill, n_train, n_test, seed):
    """n_train + n_test distinct (text, label) pairs, labels in turn, shuffled."""
    rng = random.Random(seed)
    labels = list(tags)
    seen, rows = set(), []
    while len(rows) < n_train + n_test:
        label = labels[len(rows) % len(labels)]
        words, templates = tags[label]
        text = fill(rng, rng.choice(templates), rng.choice(words))
        if text in seen:
            continue
        seen.add(text)
        rows.append((text, label))
    rng.shuffle(rows)
    return labels, rows[:n_train], rows[n_train:]


def write(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    os.makedirs(out, exist_ok=True)

    def fill_support(rng, t, w):
        return t.format(w=w, m=rng.choice(MONTHS), d=rng.choice(DAYS), c=rng.choice(CITIES), p=rng.choice(PHONES),
                        n=rng.choice(NDAYS))

    labels, train, test = make(SUPPORT, fill_support, 300, 100, 20261202)
    write(os.path.join(out, "support-train.jsonl"),
          [{"prompt": "Ticket: " + x + "\nQueue:", "completion": " " + y} for x, y in train])
    write(os.path.join(out, "support-test.jsonl"),
          [{"prompt": "Ticket: " + x + "\nQueue:", "choices": [" " + l for l in labels], "answer": " " + y} for x, y in test])

    def fill_reply(rng, t, w):
        return t.format(w=w, t=rng.choice(TIMES), n=rng.choice(NAMES))

    labels, train, test = make(REPLY, fill_reply, 160, 60, 20261203)
    write(os.path.join(out, "reply-train.jsonl"),
          [{"messages": [REPLY_SYSTEM, {"role": "user", "content": x}, {"role": "assistant", "content": y}]} for x, y in train])
    write(os.path.join(out, "reply-test.jsonl"),
          [{"messages": [REPLY_SYSTEM, {"role": "user", "content": x}], "choices": labels, "answer": y} for x, y in test])


if __name__ == "__main__":
    main()
