package engine

import "fmt"

// ProviderError is an answer from an upstream provider (runtime
// "upstream") that the API layer writes as it is, in the OpenAI error
// format: the provider's own 4xx with its message, param and code, or the
// 502/503/504 that stands for its outage (so the mesh fails over).
type ProviderError struct {
	// Provider names the configured provider.
	Provider string
	// Status is the HTTP status to answer with.
	Status int
	// Type is the OpenAI error type, e.g. "invalid_request_error".
	Type string
	// Code is the OpenAI error code ("" is sent as null).
	Code string
	// Param names the request parameter at fault ("" is sent as null).
	Param string
	// Message is the text shown to the caller. It never holds the
	// provider's key.
	Message string
	// RetryAfter, when > 0, is sent as Retry-After in seconds.
	RetryAfter int
	// Err is the underlying cause, for logs; it is not shown to callers.
	Err error
}

// Error names the provider, the status and the message.
func (e *ProviderError) Error() string {
	return fmt.Sprintf("upstream provider %s: %d %s", e.Provider, e.Status, e.Message)
}

// Unwrap returns the underlying cause.
func (e *ProviderError) Unwrap() error { return e.Err }
