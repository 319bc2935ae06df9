package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/engine"
)

// maxErrorBody bounds how much of a provider's error answer is read.
const maxErrorBody = 64 << 10

// maxResponseBody bounds an unstreamed provider answer.
const maxResponseBody = 64 << 20

// errTimeout is the cancellation cause when a provider exceeds its timeout.
var errTimeout = errors.New("provider timeout")

// client calls one provider.
type client struct {
	p    *provider
	http *http.Client
}

// call is one request to the provider: its response and the timer that
// bounds it. Close releases both.
type call struct {
	resp   *http.Response
	ctx    context.Context
	cancel context.CancelCauseFunc
	timer  *time.Timer
	p      *provider
}

// touch restarts the timeout (a streamed event arrived).
func (c *call) touch() {
	if c.timer != nil {
		c.timer.Reset(c.p.timeout)
	}
}

// Close ends the request.
func (c *call) Close() {
	if c.timer != nil {
		c.timer.Stop()
	}
	if c.resp != nil {
		c.resp.Body.Close()
	}
	c.cancel(nil)
}

// post sends body as JSON to path and returns the call once the provider
// answered 2xx. Any other answer, or no answer, is an error from
// c.failure or c.status.
func (c *client) post(ctx context.Context, path string, body any, stream bool) (*call, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithCancelCause(ctx)
	cl := &call{ctx: cctx, cancel: cancel, p: c.p}
	if c.p.timeout > 0 {
		cl.timer = time.AfterFunc(c.p.timeout, func() { cancel(errTimeout) })
	}
	req, err := http.NewRequestWithContext(cctx, http.MethodPost, c.p.base+path, bytes.NewReader(b))
	if err != nil {
		cl.Close()
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if stream {
		req.Header.Set("Accept", "text/event-stream")
	} else {
		req.Header.Set("Accept", "application/json")
	}
	if c.p.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.p.key)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		cl.Close()
		return nil, c.failure(ctx, cctx, err)
	}
	cl.resp = resp
	if resp.StatusCode/100 != 2 {
		defer cl.Close()
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		return nil, c.status(resp, raw)
	}
	return cl, nil
}

// failure maps a transport error: the caller's own cancellation as is, the
// provider's timeout to 504, anything else (refused, reset, DNS) to 502.
func (c *client) failure(caller, cctx context.Context, err error) error {
	if caller.Err() != nil {
		return caller.Err()
	}
	if errors.Is(context.Cause(cctx), errTimeout) {
		return &engine.ProviderError{Provider: c.p.name, Status: http.StatusGatewayTimeout, Type: apierr.TypeServer, Code: apierr.CodeUpstreamTimeout,
			Message: fmt.Sprintf("The upstream provider %s did not answer within %s.", c.p.name, c.p.timeout), Err: err}
	}
	return &engine.ProviderError{Provider: c.p.name, Status: http.StatusBadGateway, Type: apierr.TypeServer, Code: apierr.CodeUpstreamUnavailable,
		Message: fmt.Sprintf("The upstream provider %s could not be reached.", c.p.name), Err: err}
}

// providerBody is the error body of OpenAI-compatible servers. Some send
// "error" as a string, some put the fields at the top level (vLLM), some
// send a number as "code" (llama.cpp): all are read.
type providerBody struct {
	Error   json.RawMessage `json:"error"`
	Message string          `json:"message"`
	Type    string          `json:"type"`
	Param   any             `json:"param"`
	Code    any             `json:"code"`
}

type errFields struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Param   any    `json:"param"`
	Code    any    `json:"code"`
}

// parseErrorBody extracts message, type, param and code ("" when absent
// or not a string).
func parseErrorBody(raw []byte) errFields {
	var b providerBody
	if json.Unmarshal(raw, &b) != nil {
		return errFields{}
	}
	f := errFields{Message: b.Message, Type: b.Type, Param: b.Param, Code: b.Code}
	if len(b.Error) > 0 {
		var s string
		if json.Unmarshal(b.Error, &s) == nil {
			f = errFields{Message: s}
		} else {
			var inner errFields
			if json.Unmarshal(b.Error, &inner) == nil {
				f = inner
			}
		}
	}
	return f
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

// status maps a provider's non-2xx answer. 4xx pass through with the
// provider's fields, except 401/403 (the node's own key was refused: that
// is the operator's problem, and the provider's message may quote part of
// the key), which become 502 like outages; 408 and 504 become 504, 503
// stays 503, every other 5xx is 502.
func (c *client) status(resp *http.Response, raw []byte) error {
	f := parseErrorBody(raw)
	msg := strings.TrimSpace(f.Message)
	if msg == "" {
		msg = http.StatusText(resp.StatusCode)
	}
	e := &engine.ProviderError{Provider: c.p.name, Status: resp.StatusCode}
	if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && ra > 0 {
		e.RetryAfter = ra
	}
	switch code := resp.StatusCode; {
	case code == http.StatusUnauthorized || code == http.StatusForbidden || code == http.StatusProxyAuthRequired:
		e.Status, e.Type, e.Code = http.StatusBadGateway, apierr.TypeServer, apierr.CodeUpstreamAuth
		e.Message = fmt.Sprintf("The upstream provider %s refused this node's credentials (HTTP %d).", c.p.name, code)
		e.Err = fmt.Errorf("provider answered %d: %s", code, msg)
	case code == http.StatusRequestTimeout || code == http.StatusGatewayTimeout:
		e.Status, e.Type, e.Code = http.StatusGatewayTimeout, apierr.TypeServer, apierr.CodeUpstreamTimeout
		e.Message = fmt.Sprintf("The upstream provider %s timed out: %s", c.p.name, msg)
	case code >= 400 && code < 500:
		e.Type, e.Code, e.Param, e.Message = f.Type, str(f.Code), str(f.Param), msg
		if e.Type == "" {
			e.Type = apierr.TypeInvalidRequest
		}
	case code == http.StatusServiceUnavailable:
		e.Type, e.Code = apierr.TypeServer, apierr.CodeUpstreamUnavailable
		e.Message = fmt.Sprintf("The upstream provider %s is unavailable: %s", c.p.name, msg)
	default:
		e.Status, e.Type, e.Code = http.StatusBadGateway, apierr.TypeServer, apierr.CodeUpstreamUnavailable
		e.Message = fmt.Sprintf("The upstream provider %s failed (HTTP %d): %s", c.p.name, code, msg)
	}
	return e
}

// badResponse is a 2xx answer that cannot be understood.
func (c *client) badResponse(format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	return &engine.ProviderError{Provider: c.p.name, Status: http.StatusBadGateway, Type: apierr.TypeServer, Code: apierr.CodeUpstreamBadResponse,
		Message: fmt.Sprintf("The upstream provider %s sent an answer this node cannot read: %v", c.p.name, err), Err: err}
}

// postJSON posts body to path and decodes the provider's unstreamed 2xx
// answer into v; errors are those of post and readJSON.
func (c *client) postJSON(ctx context.Context, path string, body, v any) error {
	cl, err := c.post(ctx, path, body, false)
	if err != nil {
		return err
	}
	defer cl.Close()
	return c.readJSON(ctx, cl, v)
}

// readJSON decodes an unstreamed 2xx answer into v.
func (c *client) readJSON(caller context.Context, cl *call, v any) error {
	raw, err := io.ReadAll(io.LimitReader(cl.resp.Body, maxResponseBody))
	if err != nil {
		return c.failure(caller, cl.ctx, err)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return c.badResponse("invalid JSON: %v", err)
	}
	return nil
}

// providerModel is what every upstream engine is: one allowed model of a
// provider, reached through that provider's client.
type providerModel struct {
	c *client
	m model
}

// ID is the canonical id upstream/<provider>/<model>.
func (e *providerModel) ID() string { return e.m.id }

// Close releases nothing: the provider's connections belong to the registry.
func (e *providerModel) Close() error { return nil }
