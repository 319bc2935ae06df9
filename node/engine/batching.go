package engine

import (
	"errors"
	"fmt"
	"time"
)

// This file holds the contract of engines that batch requests of one model
// into shared runs (the local ONNX chat decoder): the error for a full
// batch and queue, and the counters of the batch and of the prefix cache.

// ErrBusy marks a request refused because the model's batch and its
// waiting queue are full. The API layer answers it with 503
// server_overloaded and a Retry-After header (see BusyError.RetryAfter).
var ErrBusy = errors.New("engine busy")

// BusyError is the error a batching engine returns when it refuses a
// request for lack of room. errors.Is(err, ErrBusy) holds for it.
type BusyError struct {
	// Model is the id of the refusing model.
	Model string
	// RetryAfter is the engine's estimate of when to try again; the API
	// layer rounds it up to whole seconds (at least one).
	RetryAfter time.Duration
}

// Error says which model is full.
func (e *BusyError) Error() string {
	return fmt.Sprintf("model %s is busy: its batch and queue are full", e.Model)
}

// Is makes errors.Is(err, ErrBusy) true for BusyError.
func (e *BusyError) Is(target error) bool { return target == ErrBusy }

// BatchStats is a snapshot of a batching engine's scheduler.
type BatchStats struct {
	// Running is the number of sequences admitted (prefilling or decoding).
	Running int
	// Queued is the number of requests waiting for admission.
	Queued int
	// MaxBatch is the cap on Running.
	MaxBatch int
	// KVBytes is the memory the batch's key/value cache holds now.
	KVBytes int64
	// Steps counts batched decode runs since load.
	Steps uint64
	// StepRows counts rows over all decode runs (StepRows / Steps is the
	// mean batch size).
	StepRows uint64
	// PrefillChunks counts prefill runs since load.
	PrefillChunks uint64
	// Refused counts requests refused with ErrBusy since load.
	Refused uint64
}

// PrefixStats are the counters of an engine's prefix (KV) cache since load.
type PrefixStats struct {
	// Lookups counts prompts looked up.
	Lookups uint64
	// HitTokens counts prompt tokens whose keys and values came from the
	// cache; MissTokens those that were computed.
	HitTokens, MissTokens uint64
	// Evictions counts blocks dropped to stay within the budget.
	Evictions uint64
	// Inserts counts blocks stored.
	Inserts uint64
	// Blocks and Bytes are what the cache holds now; BudgetBytes is its cap
	// (0: the cache is disabled).
	Blocks      int
	Bytes       int64
	BudgetBytes int64
	// BlockTokens is the number of tokens per block.
	BlockTokens int
}

// BatchingChatter is a Chatter that batches requests and keeps a prefix
// cache; the integrator reads its counters for metrics.
type BatchingChatter interface {
	Chatter
	// BatchStats returns the scheduler's counters.
	BatchStats() BatchStats
	// PrefixStats returns the prefix cache's counters.
	PrefixStats() PrefixStats
}
