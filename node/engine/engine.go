// Package engine defines what a model runtime offers the rest of a node: the
// Engine interface that every loaded model satisfies, the per-modality
// capabilities (embeddings, background removal, ...) and the Spec that tells a
// runtime how to load a model from disk. Runtimes and pipelines live in
// sub-packages (onnx, upstream, vision, whisper, tts, upscale, diffusion,
// chat, tokenizer); this package imports none of them.
package engine

import (
	"context"
	"errors"
	"image"
	"strconv"
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
	// Vectors holds one embedding per input, in input order.
	Vectors [][]float32
	// PromptTokens is the number of input tokens the batch took, reported
	// as usage.
	PromptTokens int
}

// Embedder is implemented by engines whose Task is TaskEmbeddings.
type Embedder interface {
	Engine
	// Embed returns one vector per text or token array of req. Caller errors
	// are InputErrors (param "input" or "dimensions").
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
	// Param names the offending request parameter, e.g. "input"; it is the
	// API error's param.
	Param string
	// Msg is the message shown to the caller.
	Msg string
}

// Error returns the message naming what is wrong with the input.
func (e *InputError) Error() string { return e.Msg }

// Is makes errors.Is(err, ErrInvalidInput) true for InputError.
func (e *InputError) Is(target error) bool { return target == ErrInvalidInput }

// ---------------------------------------------------------------------------
// Chat completions.
//
// The types below are what a chat engine (TaskChat) takes and gives back.
// They mirror the OpenAI chat completions request closely enough for the
// HTTP layer to map fields one to one, but carry no JSON of their own: the
// API layer owns the wire format (and rejects n > 1, logprobs and image
// parts for models without image input before a request gets here).

// TaskChat is a decoder-only text generation model behind
// /v1/chat/completions.
const TaskChat Task = "chat"

// Chat message roles.
const (
	RoleSystem    = "system"
	RoleDeveloper = "developer" // rendered as system for templates that lack it
	RoleUser      = "user"
	RoleAssistant = "assistant"
	RoleTool      = "tool"
)

// Finish reasons, as OpenAI names them.
const (
	FinishStop      = "stop"       // the model ended, or a stop sequence matched
	FinishLength    = "length"     // max tokens (or the context window) reached
	FinishToolCalls = "tool_calls" // the answer is one or more tool calls
)

// ChatMessage is one message of the conversation. Content is the text
// (the API layer joins text parts); assistant messages may carry ToolCalls,
// tool messages ToolCallID. Parts keeps the content parts in order when the
// message had an image among them; only engines that take images
// (ImageInput) get such messages.
type ChatMessage struct {
	// Role is RoleSystem, RoleDeveloper, RoleUser, RoleAssistant or RoleTool.
	Role string
	// Content is the message text, with text parts joined.
	Content string
	// Parts are the content parts in order, set only when one of them is
	// an image; nil otherwise.
	Parts []ContentPart
	// Name is the optional participant name (OpenAI's name field).
	Name string
	// ToolCalls are the calls an assistant message made.
	ToolCalls []ToolCall
	// ToolCallID is, in a tool message, the ID of the call it answers.
	ToolCallID string
}

// ContentPart is one part of a message: text, or an image given by URL
// (https or a data: URL) with OpenAI's optional detail ("auto", "low",
// "high").
type ContentPart struct {
	// Text is a text part's text ("" for an image part).
	Text string
	// ImageURL is an image part's http(s) or data:image/ URL ("" for a
	// text part).
	ImageURL string
	// Detail is an image part's detail level: "auto", "low", "high" or ""
	// (not given).
	Detail string
}

// ImageInput is implemented by chat engines that may take image parts.
type ImageInput interface {
	// TakesImages reports whether the model accepts image parts.
	TakesImages() bool
}

// ToolCall is a function call made by the assistant. Arguments is the JSON
// text of the arguments object.
type ToolCall struct {
	// ID identifies the call; the tool message answering it carries it as
	// ToolCallID. Local engines make "call_" plus hex ids.
	ID string
	// Name is the function called.
	Name string
	// Arguments is the arguments object as JSON text.
	Arguments string
}

// Tool is a function the model may call. Parameters is its JSON schema
// (an object schema; empty means no parameters).
type Tool struct {
	// Name is the function's name, which calls to it carry.
	Name string
	// Description tells the model what the function does ("" for none).
	Description string
	// Parameters is the JSON schema of the arguments object; empty means
	// no parameters.
	Parameters []byte
	// Strict is OpenAI's function.strict flag; only upstream providers
	// receive it.
	Strict bool
}

// Tool choice modes.
const (
	ToolChoiceAuto     = "auto"     // the model decides (the default when tools are given)
	ToolChoiceNone     = "none"     // no tool calls
	ToolChoiceRequired = "required" // at least one tool call, enforced
	ToolChoiceFunction = "function" // a call to ToolChoice.Name, enforced
)

// ToolChoice is the request's tool_choice. Mode "" means auto when tools are
// given, none otherwise.
type ToolChoice struct {
	// Mode is ToolChoiceAuto, ToolChoiceNone, ToolChoiceRequired or
	// ToolChoiceFunction ("": the default).
	Mode string
	Name string // the function, for Mode ToolChoiceFunction
}

// Response format types.
const (
	FormatText       = "text"
	FormatJSONObject = "json_object"
	FormatJSONSchema = "json_schema"
)

// ResponseFormat is the request's response_format. Type "" means text.
type ResponseFormat struct {
	// Type is FormatText, FormatJSONObject or FormatJSONSchema ("": text).
	Type   string
	Name   string // json_schema.name
	Schema []byte // json_schema.schema
	Strict bool   // json_schema.strict
}

// ChatRequest is one chat completion request.
type ChatRequest struct {
	// Messages is the conversation, oldest first.
	Messages []ChatMessage
	// CacheKey is OpenAI's prompt_cache_key: requests that share it are
	// routed to the node that served one of them (node/prefix). Engines
	// ignore it.
	CacheKey string
	// Tools are the functions the model may call.
	Tools []Tool
	// ToolChoice says whether the model must, may or must not call tools.
	ToolChoice ToolChoice
	// ParallelToolCalls allows several calls in one answer (nil: allowed).
	ParallelToolCalls *bool
	// ResponseFormat asks for plain text (the default) or JSON: any object,
	// or one matching a schema.
	ResponseFormat ResponseFormat
	// MaxTokens caps the completion (0: the model's default maximum).
	MaxTokens int
	// Temperature (nil: 1); 0 is greedy decoding.
	Temperature *float64
	// TopP keeps the smallest set of tokens whose probability reaches it (nil: 1).
	TopP *float64
	// Seed makes sampling repeatable: the same seed and request give the
	// same output. nil: a random seed.
	Seed *int64
	// Stop sequences end the answer; they are not part of it.
	Stop []string
	// PresencePenalty is subtracted once from the logit of every token
	// already generated; OpenAI's range is [-2, 2] and 0 turns it off.
	PresencePenalty float64
	// FrequencyPenalty is subtracted from a token's logit once per time it
	// was generated; OpenAI's range is [-2, 2] and 0 turns it off.
	FrequencyPenalty float64
}

// ChatUsage counts tokens.
type ChatUsage struct {
	// PromptTokens is the number of tokens in the prompt.
	PromptTokens int
	// CompletionTokens is the number of tokens generated.
	CompletionTokens int
}

// TotalTokens is prompt plus completion tokens.
func (u ChatUsage) TotalTokens() int { return u.PromptTokens + u.CompletionTokens }

// ChatResponse is a finished completion: the assistant message (content
// and/or tool calls), why it ended and the token counts.
type ChatResponse struct {
	// Message is the answer: Role "assistant" with Content and/or ToolCalls.
	Message ChatMessage
	// FinishReason is why generation stopped: FinishStop, FinishLength or
	// FinishToolCalls (an upstream provider's other reasons are passed on).
	FinishReason string
	// Usage counts the prompt and completion tokens.
	Usage ChatUsage
}

// ToolCallDelta is a tool call in a stream. Engines send each call whole,
// once, in order (Index 0, 1, ...); the API layer maps it to a
// chat.completion.chunk tool_calls entry.
type ToolCallDelta struct {
	// Index is the call's position among the answer's tool calls, from 0.
	Index int
	ToolCall
}

// ChatDelta is one step of a streamed completion. The first delta carries
// Role "assistant"; then Content pieces and ToolCalls; the last carries
// FinishReason. Concatenating the Content of all deltas gives
// ChatResponse.Message.Content.
type ChatDelta struct {
	// Role is "assistant" in the first delta and "" after it.
	Role string
	// Content is the next piece of the answer's text.
	Content string
	// ToolCalls are the tool calls completed in this step.
	ToolCalls []ToolCallDelta
	// FinishReason is set in the last delta only, with the values of
	// ChatResponse.FinishReason.
	FinishReason string
}

// Chatter is implemented by engines whose Task is TaskChat.
type Chatter interface {
	Engine
	// Chat generates an answer. With onDelta non-nil the answer is also
	// streamed through it as it is produced (an error from onDelta stops
	// generation and is returned). Caller errors are InputErrors (param
	// "messages", "max_tokens", "tools", "tool_choice", "response_format",
	// "stop", ...). A cancelled ctx stops generation and returns ctx.Err().
	Chat(ctx context.Context, req ChatRequest, onDelta func(ChatDelta) error) (ChatResponse, error)
	// ContextWindow is the most tokens prompt plus completion may take.
	ContextWindow() int
	// MaxOutputTokens is the default and the maximum of MaxTokens.
	MaxOutputTokens() int
}

// TaskImageGeneration is a text-to-image model behind
// /v1/images/generations.
const TaskImageGeneration Task = "image-generation"

// ImageRequest is a text-to-image request. The API layer checks Prompt, N
// (1-4) and Size (WIDTHxHEIGHT); the other string options are passed on as
// given ("" = the model's default).
type ImageRequest struct {
	// Prompt describes the images to make.
	Prompt string
	// N is how many images to make (1-4).
	N int
	// Size is WIDTHxHEIGHT in pixels, e.g. "1024x1024".
	Size string
	// Seed is passed on as the provider's seed (nil: none is sent).
	Seed *int64
	// Quality is OpenAI's quality option, e.g. "hd".
	Quality string
	// Style is OpenAI's style option, e.g. "vivid" or "natural".
	Style          string
	ResponseFormat string // "b64_json" (the API returns nothing else)
	// Background is OpenAI's background option, e.g. "transparent".
	Background string
	// OutputFormat is the image file format, e.g. "png", "jpeg" or "webp".
	OutputFormat string
	// User is OpenAI's end-user identifier, passed on to the provider.
	User string
}

// GeneratedImage is one generated image: base64 data (B64JSON), or a URL
// from an engine that was not asked for base64.
type GeneratedImage struct {
	// B64JSON is the image file, base64-encoded.
	B64JSON string
	// URL is where the image can be fetched, when the provider sent a URL
	// instead of data.
	URL string
	// RevisedPrompt is the prompt the model used if it rewrote the given
	// one ("" otherwise).
	RevisedPrompt string
}

// ImageResult is what an image generation returns.
type ImageResult struct {
	// Created is when the images were made, in Unix seconds; 0 lets the API
	// layer use the current time.
	Created int64
	// Images are the generated images, at most N.
	Images []GeneratedImage
}

// ImageGenerator is implemented by engines whose Task is
// TaskImageGeneration.
type ImageGenerator interface {
	Engine
	// GenerateImages makes req.N images from the prompt.
	GenerateImages(ctx context.Context, req ImageRequest) (ImageResult, error)
}

// LegacyCallID is the tool call id the k-th (from 0) legacy function_call
// of a conversation gets: OpenAI's legacy functions carry no ids, so the
// API names them this way and a role "function" answer refers to the
// latest call of its function; the prefix hashes name them the same way.
func LegacyCallID(k int) string { return "call_function_" + strconv.Itoa(k) }
