// Package engine defines what a model runtime offers the rest of a node: the
// Engine interface that every loaded model satisfies, the per-modality
// capabilities (embeddings, background removal, ...) and the Spec that tells a
// runtime how to load a model from disk. Runtimes live in sub-packages
// (onnx, later upstream); this package imports none of them.
package engine

import (
	"context"
	"errors"
	"image"
)

// Task names what a model does. It selects the pipeline a runtime builds.
type Task string

// Known tasks.
const (
	TaskEmbeddings        Task = "embeddings"
	TaskBackgroundRemoval Task = "background-removal"
)

// Spec is everything a runtime needs to load one installed model. The node
// builds it from the model store's manifest; engines never read manifests.
type Spec struct {
	// ID is the canonical model id, <runtime>/<family>/<variant>.
	ID string
	// Task selects the pipeline.
	Task Task
	// Dir is the model's folder on disk.
	Dir string
	// Files maps a role ("model", "tokenizer", ...) to a file name inside Dir.
	Files map[string]string
	// Options holds pipeline settings from the manifest, e.g. "pooling":
	// "mean"|"cls", "normalize": "true", "max_tokens": "512",
	// "dimensions": "384", "truncatable_dimensions": "true", "input_size": "1024".
	Options map[string]string
}

// Engine is one loaded, ready-to-serve model.
type Engine interface {
	// ID returns the canonical model id the engine serves.
	ID() string
	// Close releases the engine's sessions and buffers.
	Close() error
}

// EmbedRequest is a batch of texts (or pre-tokenised inputs) to embed.
type EmbedRequest struct {
	// Texts are raw strings; mutually exclusive with Tokens.
	Texts []string
	// Tokens are token-id arrays, used as given (after truncation).
	Tokens [][]int64
	// Dimensions, when > 0, truncates each vector (then renormalises).
	Dimensions int
}

// EmbedResult carries one vector per input, in input order.
type EmbedResult struct {
	Vectors      [][]float32
	PromptTokens int
}

// Embedder is implemented by engines whose Task is TaskEmbeddings.
type Embedder interface {
	Engine
	Embed(ctx context.Context, req EmbedRequest) (EmbedResult, error)
	// MaxDimensions is the native vector length.
	MaxDimensions() int
	// TruncatableDimensions reports whether Dimensions < MaxDimensions is allowed.
	TruncatableDimensions() bool
}

// BackgroundRemover is implemented by engines whose Task is TaskBackgroundRemoval.
type BackgroundRemover interface {
	Engine
	// RemoveBackground returns an image of the same size whose alpha channel
	// is the predicted foreground mask.
	RemoveBackground(ctx context.Context, img image.Image) (*image.NRGBA, error)
}

// ErrInvalidInput marks errors caused by the caller's input (mapped to 400).
var ErrInvalidInput = errors.New("invalid input")

// InputError is a caller error with the offending parameter name.
type InputError struct {
	Param string
	Msg   string
}

func (e *InputError) Error() string { return e.Msg }

// Is makes errors.Is(err, ErrInvalidInput) true for InputError.
func (e *InputError) Is(target error) bool { return target == ErrInvalidInput }
