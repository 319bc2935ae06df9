package auth

import (
	"net/http"
	"strings"
)

// Class is an endpoint class: what a key allowlist names.
type Class uint8

// Endpoint classes.
const (
	// ClassUnknown is a path no class covers. Any active key may reach it;
	// the router answers 404 unknown_url.
	ClassUnknown Class = iota
	// ClassChat is chat completions.
	ClassChat
	// ClassEmbeddings is embeddings, batch submissions and batch polling.
	ClassEmbeddings
	// ClassImages is image generation and description.
	ClassImages
	// ClassAudio is speech, transcription, translation and voice cloning.
	ClassAudio
	// ClassVision is detections, faces and background removal.
	ClassVision
	// ClassModels is listing and reading models, the catalogue, installed
	// keys and provenance cards.
	ClassModels
	// ClassPull is POST /v1/models/pull.
	ClassPull
	// ClassUsage is /v1/server/usage; it also needs an admin key.
	ClassUsage
	// ClassAdmin is keys, policy and other operator endpoints under
	// /v1/server, catalogue refresh and model deletion; admin keys only.
	ClassAdmin
	// ClassMetrics is /v1/server/metrics and the dashboard's data.
	ClassMetrics
	// ClassProbes is /readyz and the dashboard page; no key needed.
	ClassProbes
)

var classNames = [...]string{
	ClassUnknown:    "unknown",
	ClassChat:       "chat",
	ClassEmbeddings: "embeddings",
	ClassImages:     "images",
	ClassAudio:      "audio",
	ClassVision:     "vision",
	ClassModels:     "models",
	ClassPull:       "pull",
	ClassUsage:      "usage",
	ClassAdmin:      "admin",
	ClassMetrics:    "metrics",
	ClassProbes:     "probes",
}

// String is the class name used in allowlists, metrics and messages.
func (c Class) String() string {
	if int(c) < len(classNames) {
		return classNames[c]
	}
	return "unknown"
}

// AdminOnly reports whether the class needs an admin key.
func (c Class) AdminOnly() bool { return c == ClassUsage || c == ClassAdmin }

// Public reports whether the class needs no key at all.
func (c Class) Public() bool { return c == ClassProbes }

// AllowlistNames lists the names a key allowlist may hold, in class order.
func AllowlistNames() []string {
	out := make([]string, 0, len(classNames))
	for c := ClassChat; c < ClassProbes; c++ {
		out = append(out, c.String())
	}
	return out
}

// ParseClass finds a class by its allowlist name.
func ParseClass(name string) (Class, bool) {
	for c := ClassChat; c < ClassProbes; c++ {
		if classNames[c] == name {
			return c, true
		}
	}
	return ClassUnknown, false
}

// Classify maps a request's method and path to its endpoint class. It
// covers /v1, the probes and dashboard, and the legacy /api paths.
func Classify(method, path string) Class {
	if len(path) > 1 {
		path = strings.TrimSuffix(path, "/")
	}
	switch path {
	case "/readyz", "/livez", "/dashboard":
		return ClassProbes
	case "/dashboard/data":
		return ClassMetrics
	}
	if rest, ok := strings.CutPrefix(path, "/v1/"); ok {
		return classifyV1(method, rest)
	}
	if rest, ok := strings.CutPrefix(path, "/api/"); ok {
		return classifyLegacy(rest)
	}
	return ClassUnknown
}

func classifyV1(method, rest string) Class {
	first, _, _ := strings.Cut(rest, "/")
	switch first {
	case "chat":
		return ClassChat
	case "embeddings", "batch":
		return ClassEmbeddings
	case "images":
		return ClassImages
	case "audio":
		return ClassAudio
	case "vision":
		return ClassVision
	case "models":
		switch {
		case rest == "models/pull":
			return ClassPull
		case method == http.MethodGet || method == http.MethodHead:
			return ClassModels
		}
		// Catalogue refresh, deletion and anything else that changes
		// models is for operators.
		return ClassAdmin
	case "server":
		switch {
		case rest == "server/usage":
			return ClassUsage
		case rest == "server/metrics":
			return ClassMetrics
		case strings.HasPrefix(rest, "server/models/") && (method == http.MethodGet || method == http.MethodHead):
			return ClassModels
		}
		// Keys, policy, members and whatever else an operator manages.
		return ClassAdmin
	}
	return ClassUnknown
}

// classifyLegacy maps the legacy (Ollama-style) API so the same allowlists
// and counting apply when it is served through this chain.
func classifyLegacy(rest string) Class {
	switch rest {
	case "chat", "generate":
		return ClassChat
	case "embed", "embeddings":
		return ClassEmbeddings
	case "tags", "show", "ps", "version":
		return ClassModels
	case "pull":
		return ClassPull
	case "create", "copy", "delete", "push":
		return ClassAdmin
	}
	return ClassUnknown
}

// Counted reports whether a request counts toward rate limits, quotas and
// budgets: work on chat, embeddings (a batch submission once), images,
// audio, vision and pulls. Listing models, probes, polling or cancelling a
// batch job, metrics, the dashboard and admin calls are not counted.
func Counted(method, path string) bool {
	switch Classify(method, path) {
	case ClassChat, ClassEmbeddings, ClassImages, ClassAudio, ClassVision, ClassPull:
	default:
		return false
	}
	if method == http.MethodPost {
		return true
	}
	// Live transcription is a WebSocket opened with GET.
	return LiveSession(method, path)
}

// LiveSession reports whether a request opens a live session (the live
// transcription WebSocket): long-lived, so it is capped as a session, not
// held as a request in flight.
func LiveSession(method, path string) bool {
	return method == http.MethodGet && strings.HasSuffix(strings.TrimSuffix(path, "/"), "/audio/transcriptions/stream")
}
