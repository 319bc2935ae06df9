#!/usr/bin/python3
"""Reference renderer for chat templates, for the parity tests in
node/engine/chat.

It renders templates the way Hugging Face transformers' apply_chat_template
does: jinja2's ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks
and the loopcontrols extension, a tojson filter that is json.dumps with
ensure_ascii=False (indent, separators and sort_keys passed through), and
the raise_exception and strftime_now globals. strftime_now reads a fixed
clock given on the command line so renders are reproducible.

Input on stdin: a JSON list of cases {"id", "template" (a file path) or
"source" (the template text), "vars" (the template context)}. Output on stdout: a JSON list of
{"id", "out"} or {"id", "error", "raised"} in the same order; "raised" is
true when the template called raise_exception.

Usage: render.py YYYY-MM-DDTHH:MM:SS < cases.json
"""
import json
import sys
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class Raised(jinja2.exceptions.TemplateError):
    """What raise_exception throws (a TemplateError, as in transformers)."""


class AssistantTracker(Extension):
    """transformers' {% generation %} ... {% endgeneration %} block, which
    renders its body unchanged (the index tracking is left out)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    def _generation_support(self, caller):
        return caller()


def main():
    now = datetime.fromisoformat(sys.argv[1])

    def raise_exception(message):
        raise Raised(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return now.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now

    compiled = {}
    results = []
    for case in json.load(sys.stdin):
        try:
            if "source" in case:
                template = env.from_string(case["source"])
            else:
                path = case["template"]
                if path not in compiled:
                    with open(path, encoding="utf-8") as f:
                        compiled[path] = env.from_string(f.read())
                template = compiled[path]
            out = template.render(**case["vars"])
            results.append({"id": case["id"], "out": out})
        except Exception as e:  # the Go side must fail on the same cases
            results.append({"id": case["id"], "error": f"{type(e).__name__}: {e}",
                            "raised": isinstance(e, Raised)})
    json.dump(results, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
