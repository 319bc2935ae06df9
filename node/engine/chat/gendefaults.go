package chat

import (
	"encoding/json"
	"fmt"
	"math"
	"os"

	"github.com/infermesh/infermesh/node/engine"
)

// GenerationDefaults are the sampling defaults a model ships in its
// generation_config.json. A nil field was absent (or null) in the file.
type GenerationDefaults struct {
	// Temperature is the default sampling temperature (>= 0).
	Temperature *float64
	// TopP is the default nucleus mass, in (0, 1].
	TopP *float64
	// TopK keeps the k most likely tokens (> 0; 0 or less in the file
	// means no top-k and leaves this nil).
	TopK *int
	// RepetitionPenalty is Hugging Face's multiplicative penalty (> 0; 1 is
	// none).
	RepetitionPenalty *float64
	// DoSample false means greedy decoding, whatever the temperature.
	DoSample *bool
}

// LoadGenerationDefaults reads the sampling defaults of a
// generation_config.json file.
func LoadGenerationDefaults(path string) (GenerationDefaults, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return GenerationDefaults{}, fmt.Errorf("chat: %w", err)
	}
	return ParseGenerationDefaults(data)
}

// ParseGenerationDefaults parses the sampling fields of a
// generation_config.json: temperature, top_p, top_k, repetition_penalty
// and do_sample. Other fields are ignored; out-of-range values are errors.
func ParseGenerationDefaults(data []byte) (GenerationDefaults, error) {
	var f struct {
		Temperature       *float64 `json:"temperature"`
		TopP              *float64 `json:"top_p"`
		TopK              *float64 `json:"top_k"`
		RepetitionPenalty *float64 `json:"repetition_penalty"`
		DoSample          *bool    `json:"do_sample"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return GenerationDefaults{}, fmt.Errorf("chat: generation_config.json: %w", err)
	}
	g := GenerationDefaults{Temperature: f.Temperature, TopP: f.TopP, RepetitionPenalty: f.RepetitionPenalty, DoSample: f.DoSample}
	bad := func(name string, v float64) error {
		return fmt.Errorf("chat: generation_config.json: %s %v is out of range", name, v)
	}
	if t := g.Temperature; t != nil && (*t < 0 || math.IsNaN(*t) || math.IsInf(*t, 0)) {
		return GenerationDefaults{}, bad("temperature", *t)
	}
	if p := g.TopP; p != nil && !(*p > 0 && *p <= 1) {
		return GenerationDefaults{}, bad("top_p", *p)
	}
	if r := g.RepetitionPenalty; r != nil && !(*r > 0 && !math.IsInf(*r, 0)) {
		return GenerationDefaults{}, bad("repetition_penalty", *r)
	}
	if k := f.TopK; k != nil {
		if *k != math.Trunc(*k) || *k > math.MaxInt32 {
			return GenerationDefaults{}, bad("top_k", *k)
		}
		if *k > 0 {
			n := int(*k)
			g.TopK = &n
		}
	}
	return g, nil
}

// Greedy reports whether the model asks for greedy decoding by default
// (do_sample false).
func (g GenerationDefaults) Greedy() bool { return g.DoSample != nil && !*g.DoSample }

// Apply fills the sampling parameters req left unset with the model's
// defaults; what the request sets always wins. With do_sample false an
// unset temperature becomes 0 (greedy) and top_p is left alone.
// engine.ChatRequest has no top-k or repetition-penalty parameter, so
// TopK and RepetitionPenalty are not applied here.
func (g GenerationDefaults) Apply(req *engine.ChatRequest) {
	if req == nil {
		return
	}
	if req.Temperature == nil {
		switch {
		case g.Greedy():
			zero := 0.0
			req.Temperature = &zero
		case g.Temperature != nil:
			t := *g.Temperature
			req.Temperature = &t
		}
	}
	if req.TopP == nil && g.TopP != nil && !g.Greedy() {
		p := *g.TopP
		req.TopP = &p
	}
}
