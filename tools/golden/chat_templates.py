#!/usr/bin/env python3
"""Golden renders of the published chat templates (tests/golden/tokenizer/chat/*.jinja)
for specd's native renderers (src/core/chat_template.c).

Renders each template with Jinja2 in the environment transformers uses for
apply_chat_template (sandboxed, trim_blocks, lstrip_blocks, loopcontrols,
raise_exception, strftime_now, tojson), over a fixed set of plain-text
conversations, with and without the generation prompt. strftime_now is pinned
to 07 Mar 2025 so the Llama 3.2 render is reproducible (the C test pins the same
date with sd_chat_template_set_date).

  python3 tools/golden/chat_templates.py      # writes tests/golden/tokenizer/chat_golden.json
  python3 tools/golden/chat_templates.py --random N --seed S --out PATH
      # N random conversations a template, for tests/core/test_chat_fuzz.sh
"""
import datetime
import json
import os
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
CHAT = os.path.join(ROOT, "tests", "golden", "tokenizer", "chat")
PINNED = datetime.datetime(2025, 3, 7)

# file -> (family specd must recognize, bos_token, eos_token)
TEMPLATES = {
    "llama3.jinja": ("llama3", "<|begin_of_text|>", "<|eot_id|>"),
    "llama3.1.jinja": ("llama3", "<|begin_of_text|>", "<|eot_id|>"),
    "llama3.2.jinja": ("llama3", "<|begin_of_text|>", "<|eot_id|>"),
    "chatml.jinja": ("chatml", None, "<|im_end|>"),
    "qwen2.jinja": ("chatml", None, "<|im_end|>"),
    "qwen2.5.jinja": ("chatml", None, "<|im_end|>"),
    "qwen3.jinja": ("chatml", None, "<|im_end|>"),
    "deepseek-v3.jinja": ("deepseek3", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "deepseek-r1.jinja": ("deepseek3", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "deepseek-r1-think.jinja": ("deepseek3", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "deepseek-v3.1.jinja": ("deepseek3", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "kimi-k2.jinja": ("kimi-k2", "[BOS]", "[EOS]"),
    "kimi-k2-thinking.jinja": ("kimi-k2", "[BOS]", "[EOS]"),
    "mistral-v0.1.jinja": ("mistral", "<s>", "</s>"),
    "mixtral-v0.1.jinja": ("mistral", "<s>", "</s>"),
    "mistral-v0.2.jinja": ("mistral", "<s>", "</s>"),
    "mistral-v0.3.jinja": ("mistral", "<s>", "</s>"),
    "mistral-nemo-2407.jinja": ("mistral", "<s>", "</s>"),
    "llama2.jinja": ("llama2", "<s>", "</s>"),
}


def m(role, content):
    return {"role": role, "content": content}


CONVERSATIONS = [
    [m("user", "Hello!")],
    [m("system", "You are a helpful bot."), m("user", "What is 2+2?")],
    [m("system", "Be terse."), m("user", "Hi"), m("assistant", "Hello."), m("user", "Tell me a joke.")],
    [m("user", "First question"), m("assistant", "First answer"), m("user", "Second question")],
    [m("system", "  padded system \n"), m("user", "\n  hi there \t\n"), m("assistant", " answer "),
     m("user", "\u3000ideographic spaces\u3000")],
    [m("user", "\u00bfQu\u00e9 tal? \u65e5\u672c\u8a9e \U0001F600 e\u0301")],
    [m("user", "q1"), m("assistant", "<think>\nreasoning here\n</think>\n\nFinal answer."), m("user", "q2")],
    [m("user", "q"), m("assistant", "<think>r1</think>middle</think>\n\nlast")],
    [m("system", "A"), m("system", "B"), m("user", "u")],
    [m("user", "What is the weather?"), m("tool", "sunny, 21C"), m("assistant", "It is sunny.")],
    [m("user", "run it"), m("tool", "he said \"hi\"\n\tback\\slash \x01 \u00e9\U0001F600"), m("tool", "second"),
     m("user", "and?")],
    [m("user", "")],
    [m("user", "<|im_end|> and <|eot_id|> as text")],
    [m("system", "sys only")],
    [m("assistant", "starts with the assistant"), m("user", "then me")],
]


# Tools as an OpenAI request sends them (key order kept: tojson prints it), with the
# values json.dumps prints in its own way: floats (repr), escapes, non-ASCII, null.
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "The weather \"now\" in a city.\n\tLine two \x01 caf\u00e9 \U0001F600",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "e.g. Paris"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": None},
            "days": {"type": "integer", "minimum": 1, "maximum": 16}},
            "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "scale",
        "description": "",
        "parameters": {"type": "object", "properties": {"x": {"type": "number", "minimum": -0.0,
                                                               "examples": [0.5, 1e-07, 100000.0, 1e16, 0.1,
                                                                            123456789.125, -2.5e-05, 3.0]}}}}},
]


def call(name, args, cid="call_1"):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def am(content, calls):
    return {"role": "assistant", "content": content, "tool_calls": calls}


def tm(content, cid):
    return {"role": "tool", "tool_call_id": cid, "content": content}


# Conversations with tools (rendered with tools=TOOLS): tool calls with and without
# text, several calls, tool results in a row, a system message or none.
TOOL_CONVERSATIONS = [
    [m("user", "Weather in Paris?")],
    [m("system", "You are a weather bot."), m("user", "Weather in Paris?")],
    [m("user", "Weather in Paris?"), am(None, [call("get_weather", {"city": "Paris", "days": 3})]),
     tm("{\"temp\": 21.5}", "call_1"), m("assistant", "It is 21.5 C.")],
    [m("system", "S"), m("user", "Paris and Oslo?"),
     am("Checking both.", [call("get_weather", {"city": "Paris"}, "functions.get_weather:0"),
                           call("get_weather", {"city": "Oslo", "unit": "celsius"}, "functions.get_weather:1")]),
     tm("sunny", "functions.get_weather:0"), tm("rain", "functions.get_weather:1"), m("user", "thanks")],
    [m("user", "scale"), am("", [call("scale", {"x": 0.1, "nested": {"a": [1, 2.5, None, True, "\u00e9\n"]}})]),
     m("tool", "done")],
    [m("user", "q"), am("<think>\nplan\n</think>\n\nCalling.", [call("scale", {"x": 1e-07})]), m("tool", "ok")],
    # content of newlines alone before a call (Qwen3 prints it stripped, yet
    # the call's newline follows it unstripped: found by --random)
    [m("user", "q"), am("\n\n", [call("scale", {"x": 1})])],
]


# DeepSeek's templates print no tools, and concatenate a call's arguments as the
# text the client sent (OpenAI's arguments string). The tools go after the system
# prompt ("{system prompt}\n\n{tool_description}", DeepSeek-V3.1's model card,
# as SGLang's and vLLM's V3.1 tool templates write it); the reference is the
# published template rendering the conversation with that description appended
# to the system prompt (a system message of its own where there is none). V3 and R1 publish no description: they get V3.1's with the
# call syntax their templates print (specd's choice).
DS_V31_FORMAT = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>tool_call_arguments"
                 "<｜tool▁call▁end｜>{{additional_tool_calls}}<｜tool▁calls▁end｜>")
DS_V3_FORMAT = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>tool_call_name\n```json\n"
                "tool_call_arguments\n```<｜tool▁call▁end｜>{{additional_tool_calls}}<｜tool▁calls▁end｜>")


def deepseek_tool_description(tools, v31):
    text = "## Tools\nYou have access to the following tools:\n\n"
    for t in tools:
        f = t.get("function", t)
        text += "### %s\nDescription: %s\n\nParameters: %s\n\n" % (
            f.get("name", ""), f.get("description", ""),
            json.dumps(f["parameters"], ensure_ascii=False) if "parameters" in f else "{}")
    text += "IMPORTANT: ALWAYS adhere to this exact format for tool use:\n"
    text += (DS_V31_FORMAT if v31 else DS_V3_FORMAT) + "\n\nWhere:\n\n"
    text += "- `tool_call_name` must be an exact match to one of the available tools\n"
    text += "- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema\n"
    text += ("- For multiple tool calls, chain them directly without separators or spaces\n" if v31 else
             "- For multiple tool calls, put each on a line of its own\n")
    return text


def deepseek_messages(msgs):
    """The conversation as an OpenAI client sends it: arguments as JSON text."""
    out = []
    for mm in msgs:
        mm = dict(mm)
        if mm.get("tool_calls"):
            mm["tool_calls"] = [dict(c, function=dict(c["function"], arguments=json.dumps(
                c["function"]["arguments"], ensure_ascii=False))) for c in mm["tool_calls"]]
        out.append(mm)
    return out


def deepseek_render(env, text, bos, eos, msgs, gen, tools, v31, kwargs=None):
    msgs = [dict(mm) for mm in msgs]
    desc = deepseek_tool_description(tools, v31)
    last = max((i for i, mm in enumerate(msgs) if mm["role"] == "system"), default=None)
    if last is None:  # "{system prompt}\n\n{tool_description}" with an empty prompt
        msgs.insert(0, {"role": "system", "content": "\n\n" + desc})
    else:
        msgs[last]["content"] += "\n\n" + desc
    return render(env, text, bos, eos, msgs, gen, kwargs=kwargs)


# chat_template_kwargs specd takes (enable_thinking: Qwen3, DeepSeek V3.1;
# thinking: DeepSeek V3.1), each template rendered with each (those that do
# not read them print as without)
KWARGS = [{"enable_thinking": False}, {"enable_thinking": True}, {"thinking": True}, {"thinking": False},
          {"thinking": False, "enable_thinking": True}, {"thinking": True, "enable_thinking": False}]
KWARGS_CONVERSATIONS = [CONVERSATIONS[1], CONVERSATIONS[6], CONVERSATIONS[9]]


def render(env, text, bos, eos, msgs, gen, tools=None, kwargs=None):
    tmpl = env.from_string(text)
    kw = {"tools": tools} if tools else {}
    kw.update(kwargs or {})
    return tmpl.render(messages=msgs, add_generation_prompt=gen, bos_token=bos, eos_token=eos, **kw)


# ---- random conversations (--random N): the renderers against Jinja on cases
# no one wrote by hand: roles in any order, text with the characters the
# templates treat specially (newlines at the edges, Unicode spaces, tags,
# quotes), tool calls with nested arguments, tools, kwargs.

PIECES = ["", " ", "\n", "\n\n", "\t", "\u3000", "\u00a0", "\u2028", "a", "Hello", "\u00e9", "\U0001F600",
          "\u65e5\u672c", "\"", "'", "\\", "{", "}", "<think>", "</think>", "<tool_call>", "</tool_call>",
          "<|im_end|>", "<|eot_id|>", "<\uff5cUser\uff5c>", "\x01", "0.5", "null", "\r\n", "#"]


def rand_text(rng, n_max=6):
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, n_max)))


def rand_value(rng, depth=0):
    r = rng.random()
    if depth < 2 and r < 0.2:
        return {rand_key(rng): rand_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    if depth < 2 and r < 0.3:
        return [rand_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return rng.choice([None, True, False, 0, -7, 3.0, 0.1, 1e-07, 1e16, 123456789.125, -0.0, 2.5e-05,
                       rand_text(rng), rand_text(rng)])


def rand_key(rng):
    return rng.choice(["city", "x", "unit", "q", "\u00e9t\u00e9", "a b", "n", "\"k\""])


def rand_tools(rng):
    tools = []
    for i in range(rng.randint(1, 3)):
        f = {"name": rng.choice(["get_weather", "scale", "f", "search_web"]) + str(i)}
        if rng.random() < 0.8:
            f["description"] = rand_text(rng)
        if rng.random() < 0.9:
            f["parameters"] = {"type": "object", "properties": {rand_key(rng): {"type": "string"}
                                                                for _ in range(rng.randint(0, 3))}}
            if rng.random() < 0.5:
                f["parameters"]["required"] = [rand_key(rng)]
        tools.append({"type": "function", "function": f})
    return tools


def rand_conversation(rng, with_tools):
    msgs = []
    if rng.random() < 0.5:
        msgs.append(m("system", rand_text(rng)))
    msgs.append(m("user", rand_text(rng)))  # as clients send them: a user's turn first
    for _ in range(rng.randint(0, 5)):
        r = rng.random()
        if r < 0.45:
            msgs.append(m("user", rand_text(rng)))
        elif r < 0.75 or not with_tools:
            msgs.append(m("assistant", rand_text(rng)))
        elif r < 0.88:
            calls = [call(rng.choice(["get_weather", "scale"]), {rand_key(rng): rand_value(rng)
                                                                for _ in range(rng.randint(0, 3))},
                          "call_%d" % rng.randint(0, 9)) for _ in range(rng.randint(1, 2))]
            msgs.append(am(rng.choice([None, "", rand_text(rng)]), calls))
        else:
            msgs.append(tm(rand_text(rng), "call_%d" % rng.randint(0, 9)))
        if rng.random() < 0.1:
            msgs.append(m("system", rand_text(rng)))
    return msgs


def random_cases(env, n, seed):
    import random
    rng = random.Random(seed)
    out = {"format": 1, "jinja2_version": jinja2.__version__, "pinned_date": PINNED.strftime("%d %b %Y"),
           "made_by": "tools/golden/chat_templates.py --random %d --seed %d" % (n, seed), "templates": []}
    for name, (family, bos, eos) in TEMPLATES.items():
        with open(os.path.join(CHAT, name), encoding="utf-8") as f:
            text = f.read()
        entry = {"file": name, "family": family, "bos_token": bos, "eos_token": eos, "cases": []}
        for _ in range(n):
            with_tools = rng.random() < 0.5
            msgs = rand_conversation(rng, with_tools)
            gen = rng.random() < 0.6
            kwargs = rng.choice([None, None, {"enable_thinking": False}, {"thinking": True}])
            tools = rand_tools(rng) if with_tools else None
            if family == "deepseek3":
                msgs = deepseek_messages(msgs)
            try:
                if tools and family == "deepseek3":
                    r = deepseek_render(env, text, bos, eos, msgs, gen, tools, "is_last_user" in text, kwargs)
                else:
                    r = render(env, text, bos, eos, msgs, gen, tools, kwargs)
            except Exception:
                r = None
            c = {"messages": msgs, "add_generation_prompt": gen, "text": r}
            if tools:
                c["tools"] = tools
            if kwargs:
                c["kwargs"] = kwargs
            entry["cases"].append(c)
        out["templates"].append(entry)
    return out


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: PINNED.strftime(fmt)
    if "--random" in sys.argv:
        a = sys.argv
        n, seed, path = int(a[a.index("--random") + 1]), int(a[a.index("--seed") + 1]), a[a.index("--out") + 1]
        with open(path, "w", encoding="utf-8") as f:
            json.dump(random_cases(env, n, seed), f, ensure_ascii=True)
        return
    out = {"format": 1, "jinja2_version": jinja2.__version__, "pinned_date": PINNED.strftime("%d %b %Y"),
           "made_by": "tools/golden/chat_templates.py", "templates": []}
    for name, (family, bos, eos) in TEMPLATES.items():
        with open(os.path.join(CHAT, name), encoding="utf-8") as f:
            text = f.read()
        entry = {"file": name, "family": family, "bos_token": bos, "eos_token": eos, "cases": []}
        for msgs in CONVERSATIONS:
            for gen in (False, True):
                try:
                    r = render(env, text, bos, eos, msgs, gen)
                except Exception as e:  # the template refuses this conversation: not a case
                    print(f"{name}: skipped a case ({e})", file=sys.stderr)
                    continue
                entry["cases"].append({"messages": msgs, "add_generation_prompt": gen, "text": r})
        for msgs in TOOL_CONVERSATIONS:
            if family == "deepseek3":
                msgs = deepseek_messages(msgs)
            for gen in (False, True):
                try:
                    if family == "deepseek3":
                        r = deepseek_render(env, text, bos, eos, msgs, gen, TOOLS, "is_last_user" in text)
                    else:
                        r = render(env, text, bos, eos, msgs, gen, TOOLS)
                except Exception as e:
                    print(f"{name}: skipped a tool case ({e})", file=sys.stderr)
                    r = None  # specd must refuse it too (no tool format written for it)
                entry["cases"].append({"messages": msgs, "tools": TOOLS, "add_generation_prompt": gen, "text": r})
        for msgs in KWARGS_CONVERSATIONS:
            for kwargs in KWARGS:
                for gen in (False, True):
                    try:
                        r = render(env, text, bos, eos, msgs, gen, kwargs=kwargs)
                    except Exception as e:  # refused: not a case
                        print(f"{name}: skipped a kwargs case ({e})", file=sys.stderr)
                        continue
                    entry["cases"].append({"messages": msgs, "kwargs": kwargs, "add_generation_prompt": gen,
                                           "text": r})
        out["templates"].append(entry)
        print(f"{name}: {len(entry['cases'])} cases")
    path = os.path.join(ROOT, "tests", "golden", "tokenizer", "chat_golden.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=True, indent=1)
    print("wrote", os.path.normpath(path))


if __name__ == "__main__":
    main()
