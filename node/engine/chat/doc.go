// Package chat is the model-independent half of chat completions: it turns
// an engine.ChatRequest into prompt tokens and runs the decode loop over
// whatever computes the logits (a Forwarder; node/engine/onnx provides one
// per request with its KV cache).
//
//	template*.go  the model's own Jinja chat template, rendered by an
//	              in-package jinja2-compatible engine (Hugging Face's
//	              trim_blocks/lstrip_blocks, Python value semantics, tojson)
//	              checked against Python's jinja2, or a built-in ChatML /
//	              Llama 3 format when the model has no template (formats.go)
//	gendefaults.go generation_config.json sampling defaults
//	validate.go   request checks that become 400s with the OpenAI param name
//	sampler.go    greedy at temperature 0; temperature, top-p, seeded PCG;
//	              presence and frequency penalties
//	stop.go       stop sequences across token boundaries, held back until
//	              they can no longer match, never emitted
//	schema.go     JSON schema -> grammar nodes (properties in order,
//	              required, enum/const, nested objects and arrays, unions
//	              that differ in their first byte, local $ref)
//	automaton.go  a byte-level JSON automaton over those nodes with a
//	              persistent stack, and MinClose: the exact number of bytes
//	              that still completes the value
//	mask.go       per-token bytes computed once per model and a byte trie,
//	              walked from the automaton's state to mask tokens per step;
//	              a token is allowed only if the value can still be closed
//	              within the remaining max_tokens, so output always parses
//	toolcall.go   Qwen / Hermes <tool_call> blocks: a grammar for forced calls
//	              (tool_choice required or a named function) and a scanner
//	              that recognises calls in free text (tool_choice auto)
//	generate.go   Model, Prepare (render, tokenize, limits, constraint) and
//	              Generate (the loop, streaming deltas, usage)
//
// Everything here is pure Go and immutable after construction except the
// per-request generation state.
package chat
