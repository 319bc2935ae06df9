// Package apierr is the one vocabulary of the errors the node's HTTP API
// sends: the OpenAI error types and the machine-readable codes, the Error
// body and the function that writes it. Every package that refuses a
// request (api, auth, limits, dispatch, audit, the upstream engine, model
// pulls) takes its strings from here, so a code means one thing wherever
// it appears. The body is OpenAI's:
//
//	{"error": {"message": "...", "type": "...", "param": null, "code": "..."}}
//
// It imports nothing of this module: any package may use it.
package apierr

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// Error types (the body's "type").
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeAuthentication = "authentication_error"
	TypePermission     = "permission_error"
	TypeRateLimit      = "rate_limit_error"
	TypeServer         = "server_error"
	TypeNotImplemented = "not_implemented_error"
	// TypeServiceUnavailable is what the dispatcher's own 503s (no node
	// can serve the model now) carry.
	TypeServiceUnavailable = "service_unavailable"
)

// Error codes of requests the API refuses (the body's "code"). The spec
// names model_not_found and the overload and drain codes; the rest follow
// the OpenAI reference where it has one, and are listed in docs/ (the guide of each route family, docs/governance.md for limits).
const (
	CodeModelNotFound        = "model_not_found"
	CodeModelNotSupported    = "model_not_supported"
	CodeUnknownURL           = "unknown_url"
	CodeMethodNotAllowed     = "method_not_allowed"
	CodeInvalidJSON          = "invalid_json"
	CodeInvalidValue         = "invalid_value"
	CodeMissingParam         = "missing_required_parameter"
	CodeUnknownParam         = "unknown_parameter"
	CodeInvalidType          = "invalid_type"
	CodeTooLarge             = "request_too_large"
	CodeRequestTimeout       = "request_timeout"
	CodeNoProviderConfigured = "no_provider_configured"
	CodeTimeout              = "timeout"
	CodeInternal             = "internal_error"
)

// Codes of refusals for load and shutdown.
const (
	CodeOverloaded = "server_overloaded"
	CodeDraining   = "server_draining"
	// CodeCatchingUp: a keyed request reached a replica that has not yet
	// applied the replicated keys it needs.
	CodeCatchingUp = "replica_catching_up"
)

// Codes of the JSON answers that replace Go's own plain-text refusals of
// malformed HTTP (node's jsonReplyConn).
const (
	CodeUnsupportedTransferEncoding = "unsupported_transfer_encoding"
	CodeHeadersTooLarge             = "request_header_fields_too_large"
	CodeMalformedRequest            = "malformed_request"
)

// Codes of authentication and permission refusals (node/auth). 401
// invalid_api_key and 403 permission_denied follow OpenAI's codes for the
// same conditions.
const (
	CodeInvalidAPIKey     = "invalid_api_key"
	CodePermissionDenied  = "permission_denied"
	CodeTooManyFailedAuth = "too_many_failed_auth"
	CodeGovernanceDenied  = "governance_denied"
)

// Codes of limit refusals (node/limits): 429 rate_limit_error, or 503
// server_error for quota_unavailable.
const (
	CodeRateLimit        = "rate_limit_exceeded"
	CodeClientRateLimit  = "client_rate_limit_exceeded"
	CodeDailyQuota       = "daily_quota_exceeded"
	CodeMonthlyBudget    = "monthly_budget_exceeded"
	CodeQuotaUnavailable = "quota_unavailable"
	// Free plan refusals (429, or 403 for the local-only rule); a paid
	// plan lifts them (Error.Upgrade).
	CodeFreeDaily     = "free_plan_daily_limit_exceeded"
	CodeFreeRate      = "free_plan_rate_limit_exceeded"
	CodeFreeLocalOnly = "free_plan_local_only"
	// CodeWorkLimit (400): the work a request asks (image megapixel-steps,
	// speech characters, audio seconds) is more than the node serves per
	// request. CodeWorkShare (429 with Retry-After): the caller's earlier
	// requests hold its share of the node's work.
	CodeWorkLimit = "work_limit_exceeded"
	CodeWorkShare = "work_share_exceeded"
)

// Codes of a caller over its fair share of a node (429 rate_limit_error):
// the request bodies it holds while they arrive, its open live sessions.
const (
	CodeBodyShare    = "body_share_exceeded"
	CodeSessionLimit = "session_limit_exceeded"
)

// Codes of the model routes and of a pull's error event (node/models).
const (
	CodeModelBlocked      = "model_blocked"
	CodeCardNotFound      = "model_card_not_found"
	CodeNodeNotFound      = "node_not_found"
	CodeDeleteRefused     = "model_delete_refused"
	CodeCatalogNotEnabled = "catalog_unavailable"
	CodeDownloadFailed    = "download_failed"
	CodeChecksumMismatch  = "checksum_mismatch"
	CodeInstallFailed     = "install_failed"
	CodeLoadFailed        = "model_load_failed"
)

// Codes of the admin, batch and raft routes.
const (
	CodeKeyNotFound      = "key_not_found"
	CodeNoLeader         = "no_leader"
	CodeRaftPeerNotFound = "raft_peer_not_found"
	CodeBatchNotFound    = "batch_not_found"
)

// Codes of an upstream provider's outage (node/engine/upstream).
const (
	CodeUpstreamUnavailable = "upstream_unavailable"
	CodeUpstreamTimeout     = "upstream_timeout"
	CodeUpstreamAuth        = "upstream_auth_failed"
	CodeUpstreamBadResponse = "upstream_bad_response"
)

// Error is an OpenAI-style error with its HTTP status.
type Error struct {
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
	// Upgrade sends UpgradeHeader: 1 (a Free-plan limit that a paid plan
	// lifts).
	Upgrade bool `json:"-"`
}

// UpgradeHeader tells a client that a paid plan lifts the limit it hit.
const UpgradeHeader = "X-Service-Upgrade"

// Error returns the message the client sees.
func (e *Error) Error() string { return e.Message }

// New builds an Error; code and param "" are sent as null.
func New(status int, typ, code, param, msg string) *Error {
	e := &Error{Status: status, Type: typ, Message: msg}
	if code != "" {
		e.Code = code
	}
	if param != "" {
		e.Param = param
	}
	return e
}

// BadRequest is a 400 invalid_request_error.
func BadRequest(code, param, msg string) *Error {
	return New(http.StatusBadRequest, TypeInvalidRequest, code, param, msg)
}

// Body is e's JSON body, newline-terminated.
func Body(e *Error) []byte {
	b, _ := json.Marshal(map[string]*Error{"error": e})
	return append(b, '\n')
}

// Write writes e: its headers (Retry-After, UpgradeHeader), status and
// body.
func Write(w http.ResponseWriter, e *Error) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if e.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	if e.Upgrade {
		h.Set(UpgradeHeader, "1")
	}
	w.WriteHeader(e.Status)
	w.Write(Body(e))
}
