package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/infermesh/infermesh/node/engine"
)

// Error types used in the OpenAI error body.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeAuthentication = "authentication_error"
	TypePermission     = "permission_error"
	TypeRateLimit      = "rate_limit_error"
	TypeServer         = "server_error"
	TypeNotImplemented = "not_implemented_error"
)

// Error codes this API emits. The first four come from the spec; the rest
// follow the OpenAI reference where it has one and are documented in README.
const (
	CodeModelNotFound        = "model_not_found"
	CodeUnknownURL           = "unknown_url"
	CodeGovernanceDenied     = "governance_denied"
	CodeNoProviderConfigured = "no_provider_configured"
	CodeInvalidJSON          = "invalid_json"
	CodeInvalidValue         = "invalid_value"
	CodeMissingParam         = "missing_required_parameter"
	CodeUnknownParam         = "unknown_parameter"
	CodeInvalidType          = "invalid_type"
	CodeTooLarge             = "request_too_large"
	CodeMethodNotAllowed     = "method_not_allowed"
	CodeModelNotSupported    = "model_not_supported"
	CodeDraining             = "server_draining"
	CodeOverloaded           = "server_overloaded"
	CodeInternal             = "internal_error"
	CodeTimeout              = "timeout"
)

// APIError is an OpenAI-style error with its HTTP status.
type APIError struct {
	// Status is the HTTP status code; it is not part of the body.
	Status int `json:"-"`
	// Message is the human-readable error message.
	Message string `json:"message"`
	// Type is the OpenAI error type, one of the Type* constants or an
	// upstream provider's.
	Type string `json:"type"`
	// Param names the offending request parameter; nil is sent as null.
	Param any `json:"param"`
	// Code is the machine-readable error code (see the Code* constants);
	// nil is sent as null.
	Code any `json:"code"`
	// RetryAfter, when > 0, is sent as the Retry-After header in seconds.
	RetryAfter int `json:"-"`
	// Upgrade sends X-Service-Upgrade: 1 (a Free-plan limit that a paid
	// plan lifts).
	Upgrade bool `json:"-"`
}

// UpgradeHeader tells a client that a paid plan lifts the limit it hit.
const UpgradeHeader = "X-Service-Upgrade"

// Error returns the message the client sees.
func (e *APIError) Error() string { return e.Message }

// Errorf builds an APIError; param "" is sent as null.
func Errorf(status int, typ, code, param, msg string) *APIError {
	e := &APIError{Status: status, Type: typ, Message: msg}
	if code != "" {
		e.Code = code
	}
	if param != "" {
		e.Param = param
	}
	return e
}

// BadRequest is a 400 invalid_request_error.
func BadRequest(code, param, msg string) *APIError {
	return Errorf(http.StatusBadRequest, TypeInvalidRequest, code, param, msg)
}

// ModelNotFound is the spec's 404 model_not_found.
func ModelNotFound(id string) *APIError {
	return Errorf(http.StatusNotFound, TypeInvalidRequest, CodeModelNotFound, "model",
		"The model '"+id+"' does not exist or is not installed on this mesh.")
}

// WriteError writes e in the OpenAI error format. Every error the API
// returns goes through here.
func WriteError(w http.ResponseWriter, e *APIError) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if e.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	if e.Upgrade {
		h.Set(UpgradeHeader, "1")
	}
	w.WriteHeader(e.Status)
	b, _ := json.Marshal(map[string]*APIError{"error": e})
	w.Write(append(b, '\n'))
}

// writeErr maps any error to an API error: APIError as is, engine input
// errors to 400, everything else to 500 without leaking internals.
func writeErr(w http.ResponseWriter, err error) {
	var ae *APIError
	if errors.As(err, &ae) {
		WriteError(w, ae)
		return
	}
	var pe *engine.ProviderError
	if errors.As(err, &pe) {
		// An upstream provider's answer, written as the provider gave it
		// (4xx) or as the outage it stands for (502/503/504).
		e := Errorf(pe.Status, pe.Type, pe.Code, pe.Param, pe.Message)
		e.RetryAfter = pe.RetryAfter
		WriteError(w, e)
		return
	}
	var ie *engine.InputError
	if errors.As(err, &ie) {
		WriteError(w, BadRequest(CodeInvalidValue, ie.Param, ie.Msg))
		return
	}
	if errors.Is(err, engine.ErrBusy) {
		// The model's batch and its queue are full: retry shortly.
		e := Errorf(http.StatusServiceUnavailable, TypeServer, CodeOverloaded, "", "The model is serving as many requests as it can hold; retry shortly.")
		e.RetryAfter = 1
		var be *engine.BusyError
		if errors.As(err, &be) && be.RetryAfter > time.Second {
			e.RetryAfter = int((be.RetryAfter + time.Second - 1) / time.Second)
		}
		WriteError(w, e)
		return
	}
	if errors.Is(err, ErrModelNotFound) {
		WriteError(w, Errorf(http.StatusNotFound, TypeInvalidRequest, CodeModelNotFound, "model", err.Error()))
		return
	}
	if errors.Is(err, ErrWrongTask) {
		WriteError(w, BadRequest(CodeModelNotSupported, "model", err.Error()))
		return
	}
	WriteError(w, Errorf(http.StatusInternalServerError, TypeServer, CodeInternal, "", "The server had an error while processing your request."))
}

// writeJSON writes v as a 200 JSON response.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.Encode(v)
}
