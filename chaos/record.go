package chaos

import (
	"slices"
	"sync"
	"time"
)

// OpKind names one request type of the load mix.
type OpKind string

// Request types.
const (
	OpEmbedSDK  OpKind = "embeddings_sdk"   // POST /v1/embeddings through the OpenAI Go SDK
	OpEmbedRaw  OpKind = "embeddings_raw"   // the same with net/http
	OpModelsSDK OpKind = "models_sdk"       // GET /v1/models through the SDK
	OpModelsRaw OpKind = "models_raw"       // GET /v1/models/installed with net/http
	OpKeyCreate OpKind = "key_create"       // POST /v1/server/keys
	OpKeyRevoke OpKind = "key_revoke"       // DELETE /v1/server/keys/{id}
	OpKeyList   OpKind = "key_list"         // GET /v1/server/keys (a read)
	OpKeyProbe  OpKind = "key_probe"        // GET /v1/models with a created key: accepted or not
	OpQuota     OpKind = "quota_embeddings" // embeddings with the daily-quota key
	OpVision    OpKind = "vision_background"
	OpChatSDK   OpKind = "chat_sdk"    // POST /v1/chat/completions through the SDK
	OpChatSSE   OpKind = "chat_stream" // the same, streamed (SSE) through the SDK
)

// dataPlane reports whether a kind is inference traffic (latency stats).
func (k OpKind) dataPlane() bool {
	return k == OpEmbedSDK || k == OpEmbedRaw || k == OpVision || k == OpChatSDK || k == OpChatSSE
}

// Class is a request's outcome class.
type Class string

// Outcome classes. Only ClassUnexpected fails the availability check.
const (
	ClassOK          Class = "ok"           // 2xx (probes: 2xx or 401, judged by the key checker)
	ClassShed        Class = "shed_503"     // 503 with Retry-After: a cap, drain or no quorum
	ClassLimited     Class = "limited_429"  // 429 with Retry-After on the quota key
	ClassEntryDown   Class = "entry_down"   // the entry node was killed or exited meanwhile
	ClassEntryPaused Class = "entry_paused" // the entry node was SIGSTOPped meanwhile
	ClassBackendCut  Class = "backend_cut"  // 2xx head out, then the body broke as its serving node (not the entry) was killed or paused
	ClassUnexpected  Class = "unexpected"   // anything else: must be zero
)

// KeyObs is one key as a list read saw it.
type KeyObs struct {
	// Name identifies the key in the history (one register per name).
	Name string `json:"name"`
	// ID is the key's id as the node listed it.
	ID string `json:"id"`
	// Revoked is the revoked flag the node reported.
	Revoked bool `json:"revoked"`
}

// Record is one request as the client saw it.
type Record struct {
	// Seq is the order in which the recorder stored the record (as requests
	// finished), from 0.
	Seq int `json:"seq"`
	// Kind is the request type actually sent (a revoke or probe with no key to
	// use becomes a list or a models call).
	Kind OpKind `json:"kind"`
	// Entry is the id of the node the request was sent to.
	Entry string `json:"entry"`
	// Backend is X-Service-Backend of the answer.
	Backend string `json:"backend,omitempty"`
	// Start and End are offsets from the scenario start.
	Start time.Duration `json:"start_ns"`
	// End is when the answer was read or the request failed.
	End time.Duration `json:"end_ns"`
	// Status is the HTTP status (0: no answer).
	Status int `json:"status"`
	// Code is the OpenAI error code of an error answer.
	Code string `json:"code,omitempty"`
	// Msg is the OpenAI error message (cut at 200 bytes).
	Msg string `json:"message,omitempty"`
	// RetryAfter reports that the answer carried a Retry-After header.
	RetryAfter bool `json:"retry_after,omitempty"`
	// Err is the transport error, if any.
	Err string `json:"err,omitempty"`
	// Timeout reports that Err was a timeout (the request's deadline or a
	// network timeout).
	Timeout bool `json:"timeout,omitempty"`
	// Class is filled in by the classifier after the run.
	Class Class `json:"class"`
	// Why explains the class (which fault excused it, or what was wrong).
	Why string `json:"why,omitempty"`

	// Key history fields.
	KeyName string `json:"key_name,omitempty"`
	// KeyID is the key's id (revokes, probes, and creates that were
	// acknowledged).
	KeyID string   `json:"key_id,omitempty"`
	Keys  []KeyObs `json:"keys,omitempty"`  // list reads: our keys only
	Final bool     `json:"final,omitempty"` // reads made after convergence
}

// OK reports a 2xx answer.
func (r *Record) OK() bool { return r.Status >= 200 && r.Status < 300 }

// Recorder collects records from many goroutines.
type Recorder struct {
	t0   time.Time
	mu   sync.Mutex
	recs []*Record
	max  int
	lost int
}

// NewRecorder returns a recorder whose offsets count from t0; it keeps at
// most max records and counts the rest as lost.
func NewRecorder(t0 time.Time, max int) *Recorder { return &Recorder{t0: t0, max: max} }

// Since is the offset of now from t0.
func (r *Recorder) Since() time.Duration { return time.Since(r.t0) }

// T0 is the scenario start.
func (r *Recorder) T0() time.Time { return r.t0 }

// Add stores a finished record and gives it a sequence number.
func (r *Recorder) Add(rec *Record) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.recs) >= r.max {
		r.lost++
		return
	}
	rec.Seq = len(r.recs)
	r.recs = append(r.recs, rec)
}

// Records returns the records so far, sorted by start.
func (r *Recorder) Records() []*Record {
	r.mu.Lock()
	out := slices.Clone(r.recs)
	r.mu.Unlock()
	slices.SortStableFunc(out, func(a, b *Record) int { return int(a.Start - b.Start) })
	return out
}

// Lost is the count of records dropped beyond the cap.
func (r *Recorder) Lost() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lost
}
