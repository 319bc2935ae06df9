// Package upstream is the "upstream" runtime: chat, embeddings and image
// generation engines that pass requests on to an OpenAI-compatible
// provider (a llama.cpp server, vLLM, Ollama's /v1, a cloud API) over HTTP.
//
// An operator lists providers in a JSON file (see Config). Each allowed
// provider model becomes an engine with the canonical id
// upstream/<provider>/<model> (the model part lower-cased and reduced to
// [a-z0-9._-]) and the wire id <provider>:<model>. The provider's 4xx
// answers come back as engine.ProviderError with its status, message, param
// and code; its outages (refused or reset connections, timeouts, 5xx) as
// 502, 503 or 504, which the mesh retries on another node.
package upstream

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/infermesh/infermesh/node/engine"
)

// Config is the providers file.
type Config struct {
	// Providers are the OpenAI-compatible providers; their names must be
	// distinct.
	Providers []ProviderConfig `json:"providers"`
}

// ProviderConfig is one OpenAI-compatible provider.
type ProviderConfig struct {
	// Name is part of every model id: 1-64 of [a-z0-9._-], starting with a
	// letter or digit.
	Name string `json:"name"`
	// BaseURL is the provider's API root including its version path, e.g.
	// http://127.0.0.1:8080/v1; requests go to BaseURL + "/chat/completions",
	// BaseURL + "/embeddings", BaseURL + "/images/generations" and
	// BaseURL + "/audio/speech".
	BaseURL string `json:"base_url"`
	// APIKeyEnv names an environment variable holding the key.
	APIKeyEnv string `json:"api_key_env,omitempty"`
	// APIKeyFile is a file holding the key (surrounding white space is
	// ignored). At most one of APIKeyEnv and APIKeyFile may be set; with
	// neither, requests carry no key.
	APIKeyFile string `json:"api_key_file,omitempty"`
	// Timeout bounds the wait for the provider's answer to begin, every
	// gap between streamed events, and a whole unstreamed answer, e.g.
	// "60s". Empty means no bound beyond the caller's.
	Timeout string `json:"timeout,omitempty"`
	// Models is the allowlist: only these models are served.
	Models []ModelConfig `json:"models"`
}

// ModelConfig is one allowed provider model.
type ModelConfig struct {
	// Model is the provider's name for the model, sent as "model".
	Model string `json:"model"`
	// Task is "chat" (the default), "embeddings", "image-generation" or
	// "text-to-speech".
	Task string `json:"task,omitempty"`
	// Voices are a text-to-speech model's voice names, the first its
	// default; a request naming another voice is refused with a 400. Empty
	// means OpenAI's voices (alloy first), and any voice is passed on.
	Voices []string `json:"voices,omitempty"`
	// ImageInput lets a chat model take image parts (image_url) in
	// messages; without it such requests are refused with a 400.
	ImageInput bool `json:"image_input,omitempty"`
	// Dimensions is an embeddings model's native vector length. 0 leaves
	// the "dimensions" parameter for the provider to check.
	Dimensions int `json:"dimensions,omitempty"`
	// TruncatableDimensions allows "dimensions" below Dimensions.
	TruncatableDimensions bool `json:"truncatable_dimensions,omitempty"`
	// ContextWindow is a chat model's context window, prompt plus
	// completion, in tokens (0: 131072, the API's cap).
	ContextWindow int `json:"context_window,omitempty"`
	// MaxOutputTokens is the most tokens a chat model writes in one answer
	// (0: 65536, the API's cap).
	MaxOutputTokens int `json:"max_output_tokens,omitempty"`
}

// Defaults for chat models that do not say.
const (
	DefaultContextWindow   = 131072
	DefaultMaxOutputTokens = 65536
)

var (
	providerName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)
	notIDChar    = regexp.MustCompile(`[^a-z0-9._-]+`)
)

// ParseConfig decodes a providers file; unknown fields are errors.
func ParseConfig(b []byte) (Config, error) {
	var c Config
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return Config{}, fmt.Errorf("providers file: %w", err)
	}
	return c, nil
}

// LoadConfig reads and parses a providers file.
func LoadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("providers file: %w", err)
	}
	return ParseConfig(b)
}

// SanitizeID turns a provider's model name into a canonical id part: lower
// case, runs of characters outside [a-z0-9._-] replaced by '-', leading
// '.', '_' and '-' dropped, at most 64 characters.
func SanitizeID(s string) string {
	s = notIDChar.ReplaceAllString(strings.ToLower(s), "-")
	s = strings.TrimLeft(s, "._-")
	if len(s) > 64 {
		s = s[:64]
	}
	return s
}

// provider is a validated ProviderConfig with its key resolved.
type provider struct {
	name    string
	base    string
	key     string
	timeout time.Duration
	models  []model
}

// model is one allowed model with its ids.
type model struct {
	ModelConfig
	id, wire string
	task     engine.Task
}

// resolve validates the config and reads the keys. getenv looks up
// environment variables (os.Getenv in production). Errors name the
// provider and field, never a key.
func (c Config) resolve(getenv func(string) string) ([]*provider, error) {
	var errs []error
	seenProv := map[string]bool{}
	seenID := map[string]string{}
	var out []*provider
	for i, pc := range c.Providers {
		where := fmt.Sprintf("provider %d (%q)", i, pc.Name)
		if !providerName.MatchString(pc.Name) {
			errs = append(errs, fmt.Errorf("%s: name: use 1-64 of a-z, 0-9, '.', '_' or '-', starting with a letter or digit", where))
		} else if seenProv[pc.Name] {
			errs = append(errs, fmt.Errorf("%s: name used twice", where))
		}
		seenProv[pc.Name] = true
		p := &provider{name: pc.Name, base: strings.TrimRight(pc.BaseURL, "/")}
		if u, err := url.Parse(pc.BaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("%s: base_url %q: want http(s)://host[:port]/path", where, pc.BaseURL))
		}
		switch {
		case pc.APIKeyEnv != "" && pc.APIKeyFile != "":
			errs = append(errs, fmt.Errorf("%s: set api_key_env or api_key_file, not both", where))
		case pc.APIKeyEnv != "":
			if p.key = strings.TrimSpace(getenv(pc.APIKeyEnv)); p.key == "" {
				errs = append(errs, fmt.Errorf("%s: api_key_env: the variable %s is unset or empty", where, pc.APIKeyEnv))
			}
		case pc.APIKeyFile != "":
			b, err := os.ReadFile(pc.APIKeyFile)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: api_key_file: %w", where, err))
			} else if p.key = strings.TrimSpace(string(b)); p.key == "" {
				errs = append(errs, fmt.Errorf("%s: api_key_file %s is empty", where, pc.APIKeyFile))
			}
		}
		if pc.Timeout != "" {
			d, err := time.ParseDuration(pc.Timeout)
			if err != nil || d <= 0 {
				errs = append(errs, fmt.Errorf("%s: timeout %q: want a positive duration like 30s", where, pc.Timeout))
			}
			p.timeout = d
		}
		if len(pc.Models) == 0 {
			errs = append(errs, fmt.Errorf("%s: models: list at least one model", where))
		}
		for j, mc := range pc.Models {
			mwhere := fmt.Sprintf("%s model %d (%q)", where, j, mc.Model)
			m := model{ModelConfig: mc}
			switch mc.Task {
			case "", string(engine.TaskChat):
				m.task = engine.TaskChat
			case string(engine.TaskEmbeddings), string(engine.TaskImageGeneration), string(engine.TaskTextToSpeech):
				m.task = engine.Task(mc.Task)
			default:
				errs = append(errs, fmt.Errorf("%s: task %q: want chat, embeddings, image-generation or text-to-speech", mwhere, mc.Task))
			}
			if len(mc.Voices) > 0 && m.task != engine.TaskTextToSpeech {
				errs = append(errs, fmt.Errorf("%s: voices are for text-to-speech models", mwhere))
			}
			if mc.ImageInput && m.task != engine.TaskChat {
				errs = append(errs, fmt.Errorf("%s: image_input is for chat models", mwhere))
			}
			part := SanitizeID(mc.Model)
			if mc.Model == "" || part == "" || strings.ContainsAny(mc.Model, " \t\r\n") {
				errs = append(errs, fmt.Errorf("%s: model: give the provider's model name (no white space)", mwhere))
				continue
			}
			if mc.Dimensions < 0 || mc.ContextWindow < 0 || mc.MaxOutputTokens < 0 {
				errs = append(errs, fmt.Errorf("%s: dimensions, context_window and max_output_tokens must not be negative", mwhere))
			}
			if m.ContextWindow == 0 {
				m.ContextWindow = DefaultContextWindow
			}
			if m.MaxOutputTokens == 0 {
				m.MaxOutputTokens = DefaultMaxOutputTokens
			}
			m.id = "upstream/" + pc.Name + "/" + part
			m.wire = pc.Name + ":" + mc.Model
			if prev, dup := seenID[m.id]; dup {
				errs = append(errs, fmt.Errorf("%s: its id %s is also the id of %s; allow each model once", mwhere, m.id, prev))
			}
			seenID[m.id] = mwhere
			p.models = append(p.models, m)
		}
		out = append(out, p)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}
