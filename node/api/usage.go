package api

import (
	"encoding/json"
	"net/http"
)

// Served is how a request admitted for accounting ended: the status the
// client received, the node that served it and the usage its handler
// reported. Units by route: chat and embeddings count tokens; audio
// transcription and translation count input seconds of audio (rounded
// up); speech counts input characters; image generation and operations
// count output images; vision routes count one input image.
type Served struct {
	// Status is the HTTP status the client received.
	Status int
	// Backend is the node that served the request; empty when none did
	// (the entry node answered with an error itself).
	Backend string
	// PromptTokens and CompletionTokens are the usage the serving handler
	// reported, in the units above.
	PromptTokens, CompletionTokens int64
	// Aborted says the response broke off after it started; the API then
	// aborts the client connection (after accounting) so the client sees
	// the failure.
	Aborted bool
}

// usageSetter is implemented by the writers dispatch and the forward
// server hand to the local handler: usage set on them travels back to the
// node that admitted the request (in the forward trailer when it came from
// a peer).
type usageSetter interface {
	SetUsage(promptTokens, completionTokens int64)
}

// reportUsage tells whatever carries w's response how much the request
// used, following Unwrap through middleware writers. A writer chain
// without a usage setter (a test server, a route served outside dispatch)
// drops the report.
func reportUsage(w http.ResponseWriter, prompt, completion int64) {
	for w != nil {
		if u, ok := w.(usageSetter); ok {
			u.SetUsage(prompt, completion)
			return
		}
		uw, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return
		}
		w = uw.Unwrap()
	}
}

// EstimateTokens bounds what a JSON request body can cost before it runs,
// for budget reservations: the prompt is at most one token per byte of the
// body (byte-level and byte-fallback tokenizers never use more, and the
// JSON around the text is longer than any chat template's markup), and
// the output is max_completion_tokens or max_tokens when the request sets
// them (0 when it does not: the caller applies its default). A body that
// is not JSON (multipart audio, images) estimates 0 input tokens.
func EstimateTokens(body []byte) (input, maxOutput int64) {
	var probe struct {
		MaxCompletionTokens *int64 `json:"max_completion_tokens"`
		MaxTokens           *int64 `json:"max_tokens"`
	}
	if json.Unmarshal(body, &probe) != nil {
		return 0, 0
	}
	switch {
	case probe.MaxCompletionTokens != nil && *probe.MaxCompletionTokens > 0:
		maxOutput = *probe.MaxCompletionTokens
	case probe.MaxTokens != nil && *probe.MaxTokens > 0:
		maxOutput = *probe.MaxTokens
	}
	return int64(len(body)), maxOutput
}

// UsageRow is one group of GET /v1/server/usage (and of `infermesh
// usage`): the totals of one app, model, key or worker.
type UsageRow struct {
	Group            string  `json:"group"`
	Requests         int64   `json:"requests"`
	PromptTokens     int64   `json:"prompt_tokens"`
	CompletionTokens int64   `json:"completion_tokens"`
	EstimatedCost    float64 `json:"estimated_cost"`
	Errors           int64   `json:"errors"`
}

// UsageReport is the body of GET /v1/server/usage. Its fields are in the
// order the keys are sent (alphabetical, as the API has always sent them).
type UsageReport struct {
	// By is the grouping: app, model, key or worker.
	By string `json:"by"`
	// Data are the groups' totals.
	Data []UsageRow `json:"data"`
	// Object is always "list".
	Object string `json:"object"`
	// Since and Until echo the query's days, when given.
	Since string `json:"since,omitempty"`
	Until string `json:"until,omitempty"`
}
