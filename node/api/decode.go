package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/infermesh/infermesh/node/apierr"
)

// Body size limits. JSON requests are small; image requests carry base64.
const (
	MaxJSONBody  = 4 << 20
	MaxImageBody = 32 << 20
)

// readBody reads at most limit bytes of the request body; a larger body is a
// 413 and an unreadable one a 400.
func readBody(r *http.Request, limit int64) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, apierr.New(http.StatusRequestEntityTooLarge, apierr.TypeInvalidRequest, apierr.CodeTooLarge, "",
			fmt.Sprintf("Request body is larger than %d bytes.", limit))
	}
	var b []byte
	var err error
	if r.ContentLength > 0 {
		b, err = readDeclared(r.Body, r.ContentLength)
	} else {
		b, err = io.ReadAll(io.LimitReader(r.Body, limit+1))
	}
	if err != nil {
		return nil, bodyReadError(err)
	}
	if int64(len(b)) > limit {
		return nil, apierr.New(http.StatusRequestEntityTooLarge, apierr.TypeInvalidRequest, apierr.CodeTooLarge, "",
			fmt.Sprintf("Request body is larger than %d bytes.", limit))
	}
	return b, nil
}

// readDeclared reads a body of declared length n. Memory follows the
// bytes that arrive, not the declared length: a body of up to 1 MiB is
// allocated once; a larger one arrives in 256 KiB chunks and is copied
// into one slice when it is all in, so a connection that declares a large
// body and stalls holds no more than it sent (what the body gate charged).
func readDeclared(body io.Reader, n int64) ([]byte, error) {
	const exact, chunk = 1 << 20, 256 << 10
	if n <= exact {
		b := make([]byte, n)
		m, err := io.ReadFull(body, b)
		if errors.Is(err, io.ErrUnexpectedEOF) {
			err = nil
		}
		return b[:m], err
	}
	var chunks [][]byte
	var total int64
	for total < n {
		c := make([]byte, min(chunk, n-total))
		m, err := io.ReadFull(body, c)
		chunks = append(chunks, c[:m])
		total += int64(m)
		if errors.Is(err, io.EOF) && total == 0 {
			return nil, err
		}
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			break // a body shorter than declared, as io.ReadFull allows
		}
		if err != nil {
			return nil, err
		}
	}
	b := make([]byte, 0, total)
	for _, c := range chunks {
		b = append(b, c...)
	}
	return b, nil
}

// decodeStrict decodes one JSON object into v, rejecting unknown fields,
// wrong types and trailing data, and names the offending parameter.
func decodeStrict(body []byte, v any) error {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return apierr.BadRequest(apierr.CodeInvalidJSON, "", "The request body is empty; expected a JSON object.")
	}
	if trimmed[0] != '{' {
		return apierr.BadRequest(apierr.CodeInvalidJSON, "", "The request body must be a JSON object.")
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return apierr.BadRequest(apierr.CodeInvalidJSON, "", "The request body has data after the JSON object.")
	}
	return nil
}

// jsonError turns a decoding error into a 400 that names the parameter.
func jsonError(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		param := te.Field
		if param == "" {
			param = "body"
		}
		return apierr.BadRequest(apierr.CodeInvalidType, param,
			fmt.Sprintf("Invalid type for '%s': expected %s, got a JSON %s.", param, goTypeName(te.Type.String()), te.Value))
	}
	msg := err.Error()
	if f, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		f = strings.Trim(f, `"`)
		return apierr.BadRequest(apierr.CodeUnknownParam, f, fmt.Sprintf("Unrecognized request argument supplied: %s", f))
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return apierr.BadRequest(apierr.CodeInvalidJSON, "", fmt.Sprintf("We could not parse the JSON body of your request: %s at byte %d.", se.Error(), se.Offset))
	}
	return apierr.BadRequest(apierr.CodeInvalidJSON, "", "We could not parse the JSON body of your request.")
}

func goTypeName(t string) string {
	switch {
	case strings.HasPrefix(t, "int"), strings.HasPrefix(t, "uint"):
		return "an integer"
	case strings.HasPrefix(t, "float"):
		return "a number"
	case t == "string":
		return "a string"
	case t == "bool":
		return "a boolean"
	case strings.HasPrefix(t, "[]"), strings.HasPrefix(t, "map"):
		return "an array or object"
	}
	return "a different type"
}

// peekRoute reads the top-level "model" string of a JSON body without
// decoding the rest, for routing, and reports whether the body asks for
// server-sent events: a top-level "stream" that is literally true. Anything
// else (absent, false, malformed) means a one-piece response, which is also
// what a handler refusing the body answers with.
func peekRoute(body []byte) (model string, stream bool, err error) {
	var probe map[string]json.RawMessage
	// An image request's picture is neither here nor there for routing:
	// the probe reads the body without it (see bigString), unless that
	// body does not decode, whose error comes from the whole body.
	probed := false
	if s, e, ok := bigString(body, "image"); ok {
		probed = json.Unmarshal(cutSpan(body, s, e), &probe) == nil
	}
	if !probed {
		probe = nil
		if err := json.Unmarshal(body, &probe); err != nil {
			return "", false, jsonError(err)
		}
	}
	stream = string(bytes.TrimSpace(probe["stream"])) == "true"
	model, err = modelOf(probe)
	return model, stream, err
}

func modelOf(probe map[string]json.RawMessage) (string, error) {
	raw, ok := probe["model"]
	if !ok {
		return "", apierr.BadRequest(apierr.CodeMissingParam, "model", "You must provide a model parameter.")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", apierr.BadRequest(apierr.CodeInvalidType, "model", "Invalid type for 'model': expected a string.")
	}
	if s == "" {
		return "", apierr.BadRequest(apierr.CodeMissingParam, "model", "You must provide a model parameter.")
	}
	if len(s) > 256 {
		return "", apierr.BadRequest(apierr.CodeInvalidValue, "model", "The model id is longer than 256 characters.")
	}
	return s, nil
}

// decodeRequest reads a body of at most limit bytes and parses it, or
// takes the request routed already decoded for this node; on failure it
// has already written the error.
func decodeRequest[T any](w http.ResponseWriter, r *http.Request, limit int64, parse func([]byte) (T, error)) (T, bool) {
	var zero T
	if v, ok := routedParsed(r.Context()).(T); ok {
		return v, true // routed decoded this body already
	}
	body, err := readBody(r, limit)
	if err != nil {
		writeErr(w, err)
		return zero, false
	}
	v, err := parse(body)
	if err != nil {
		writeErr(w, err)
		return zero, false
	}
	return v, true
}

// modelEngine resolves a request's model and gets its engine from get
// (one of the Backend's engine getters); on failure it has written the
// error.
func modelEngine[E any](s *Server, w http.ResponseWriter, r *http.Request, id string, get func(context.Context, string) (E, error)) (Model, E, bool) {
	var zero E
	m, ok := s.meshModel(w, r, id)
	if !ok {
		return m, zero, false
	}
	eng, err := get(r.Context(), m.ID)
	if err != nil {
		writeErr(w, err)
		return m, zero, false
	}
	return m, eng, true
}

// meshModel resolves id among the mesh's models, or takes the model the
// public router resolved for this request (routed) when it named the same
// id; it answers 404 model_not_found when there is none.
func (s *Server) meshModel(w http.ResponseWriter, r *http.Request, id string) (Model, bool) {
	if m, ok := routedModel(r.Context(), id); ok {
		return m, true
	}
	m, ok := s.opt.Backend.Model(id)
	if !ok {
		apierr.Write(w, ModelNotFound(id))
	}
	return m, ok
}

// routedKey is the context key of the model routed resolved.
type routedKey struct{}

// routedResolution is the model a request named, what routed resolved it
// to, and the request routed decoded (nil when it only peeked).
type routedResolution struct {
	named  string
	model  Model
	parsed any
}

// withRouted records in ctx that the request's model named was resolved
// to m on this node, and its body decoded to parsed (nil: not decoded).
func withRouted(ctx context.Context, named string, m Model, parsed any) context.Context {
	return context.WithValue(ctx, routedKey{}, routedResolution{named, m, parsed})
}

// routedParsed is the request routed decoded, or nil.
func routedParsed(ctx context.Context) any {
	v, _ := ctx.Value(routedKey{}).(routedResolution)
	return v.parsed
}

// routedModel returns the model routed resolved for this request when the
// request named id (a peer's request, which arrives without it, or a body
// naming another id resolves again).
func routedModel(ctx context.Context, id string) (Model, bool) {
	v, ok := ctx.Value(routedKey{}).(routedResolution)
	if !ok || v.named != id {
		return Model{}, false
	}
	return v.model, true
}
