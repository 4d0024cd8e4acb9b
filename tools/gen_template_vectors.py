#!/usr/bin/env python3
"""Test vectors for nightlora's Jinja chat-template renderer (src/data/jinja_*.c).

Renders each template in tests/data/templates/*.jinja over a fixed set of conversations the
way Hugging Face transformers' apply_chat_template does (jinja2's ImmutableSandboxedEnvironment
with trim_blocks=True, lstrip_blocks=True and the loopcontrols extension; its tojson filter,
json.dumps with ensure_ascii=False; raise_exception), and writes one JSON line per case to
tests/data/templates/vectors.jsonl: the template file, the case name, the variables the template
sees, and the expected text (or the expected error). test_jinja renders every case with
nightlora and requires the same bytes.

One difference from transformers, on purpose: strftime_now is not defined (nightlora leaves it
undefined so a data file renders the same on every day; Llama 3.2's template then uses its own
fixed date "26 Jul 2024").

    python3 tools/gen_template_vectors.py          # needs jinja2 (Debian: python3-jinja2)
    python3 tools/gen_template_vectors.py --check  # exit 1 when the committed file differs
"""
import json
import os
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TDIR = os.path.join(ROOT, "tests", "data", "templates")


class TemplateError(Exception):
    pass


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' definition (it does not escape HTML characters the way jinja2's own does)
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


# The special tokens transformers passes (the tokenizer's special_tokens_map) per model family.
SPECIAL = {
    "qwen3": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "qwen3.5": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "smollm2": {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "unk_token": "<|endoftext|>"},
    "llama3.1": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "llama3.2": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "gemma3": {"bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>", "pad_token": "<pad>"},
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"},
                           "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}

S = {"role": "system", "content": "You are a terse assistant."}
U1 = {"role": "user", "content": "Tag this note: Book the hotel for Friday"}
A1 = {"role": "assistant", "content": "travel"}
U2 = {"role": "user", "content": "And this one: Call mum about Sunday lunch"}
A2 = {"role": "assistant", "content": "family"}

CASES = [
    ("user_assistant", [U1, A1], {}),
    ("system_user_assistant", [S, U1, A1], {}),
    ("multi_turn", [S, U1, A1, U2, A2], {}),
    ("prompt_only", [S, U1], {}),
    ("prompt_no_system", [U1], {}),
    ("whitespace", [{"role": "user", "content": "  padded question \n"},
                    {"role": "assistant", "content": "\n  padded answer  \n\n"}], {}),
    ("unicode_and_markup", [{"role": "user", "content": "Grüße — \"quotes\", 'apostrophes', back\\slash, tab\there"},
                            {"role": "assistant", "content": "日本語 ok <|im_end|> <end_of_turn> {{ not jinja }}"}], {}),
    ("reasoning_field", [U1, {"role": "assistant", "content": "travel",
                              "reasoning_content": "A hotel booking is travel."},
                         U2, {"role": "assistant", "content": "family",
                              "reasoning_content": "Mum is family."}], {}),
    ("reasoning_inline", [U1, {"role": "assistant", "content": "<think>\nHotel means travel.\n</think>\n\ntravel"}], {}),
    ("thinking_off", [U1], {"enable_thinking": False}),
    ("tools", [S, {"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": "",
                "tool_calls": [{"type": "function",
                                "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
               {"role": "tool", "content": "{\"temp\": 18.5, \"sky\": \"clear\"}"},
               {"role": "assistant", "content": "18.5 °C and clear."}],
     {"tools": [WEATHER_TOOL]}),
    ("tool_call_no_tools", [{"role": "user", "content": "Weather in Oslo?"},
                            {"role": "assistant", "content": "Let me check.",
                             "tool_calls": [{"type": "function",
                                             "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
                            {"role": "tool", "content": "rain"},
                            {"role": "tool", "content": "wind"},
                            {"role": "assistant", "content": "Rain and wind."}], {}),
    ("starts_with_assistant", [A1, U1], {}),
    ("date_given", [U1, A1], {"date_string": "01 Dec 2026"}),
]


def render(env, src, messages, add_generation_prompt, extra, special):
    variables = {"messages": messages, "tools": None, "documents": None,
                 "add_generation_prompt": add_generation_prompt}
    variables.update(special)
    variables.update(extra)
    try:
        return variables, env.from_string(src).render(**variables), None
    except (TemplateError, jinja2.exceptions.TemplateError, TypeError, ValueError) as e:
        return variables, None, str(e)


def main():
    env = environment()
    out = []
    names = sorted(f for f in os.listdir(TDIR) if f.endswith(".jinja"))
    for fname in names:
        fam = fname[: -len(".jinja")]
        with open(os.path.join(TDIR, fname), encoding="utf-8", newline="") as f:
            src = f.read()
        for case, msgs, extra in CASES:
            gens = [True] if msgs[-1]["role"] != "assistant" else [False, True]
            for gen in gens:
                variables, text, err = render(env, src, msgs, gen, extra, SPECIAL[fam])
                row = {"template": fname, "case": case + ("+gen" if gen else ""), "vars": variables}
                if err is None:
                    row["expected"] = text
                else:
                    row["error"] = err
                out.append(row)
    path = os.path.join(TDIR, "vectors.jsonl")
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in out)
    n_err = sum("error" in r for r in out)
    if "--check" in sys.argv[1:]:
        with open(path, encoding="utf-8", newline="") as f:
            same = f.read() == text
        print(f"{path}: {'the same as' if same else 'DIFFERS from'} jinja2 {jinja2.__version__}'s renderings "
              f"({len(out)} cases over {len(names)} templates)")
        return 0 if same else 1
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    print(f"{path}: {len(out)} cases over {len(names)} templates ({n_err} expected errors), jinja2 {jinja2.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
