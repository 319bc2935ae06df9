package api

import "net/http"

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
