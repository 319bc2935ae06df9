package whisper

import (
	"bytes"
	"compress/zlib"
	"context"
	"math"
	"math/rand/v2"
)

// Decoding thresholds of openai/whisper's transcribe().
const (
	compressionRatioThreshold = 2.4
	logprobThreshold          = -1.0
	noSpeechThreshold         = 0.6
	// maxInitialTimestamp is the latest first timestamp, in timestamp
	// steps (1.0 s).
	maxInitialTimestamp = 50
	// sampleLen is the most tokens decoded per window (n_text_ctx / 2).
	sampleLen = 224
)

// fallbackTemperatures is the schedule tried when a greedy window looks
// degenerate.
var fallbackTemperatures = [...]float32{0, 0.2, 0.4, 0.6, 0.8, 1.0}

// windowResult is one decoding of one 30 s window.
type windowResult struct {
	tokens       []int // sampled tokens, text and timestamps, without EOT
	avgLogprob   float64
	noSpeechProb float64
	compression  float64
	temperature  float32
}

// decodeOptions are a window's decoding settings.
type decodeOptions struct {
	prompt      []int // previous text tokens (already truncated)
	language    int   // language token, -1 for English-only models
	task        int   // task token, -1 for English-only models
	temperature float32
	rng         *rand.Rand
}

// initialTokens returns the prompt part before SOT and the SOT sequence.
func (e *Engine) initialTokens(o decodeOptions) (prev, sotSeq []int64) {
	c := e.cfg
	if len(o.prompt) > 0 && c.sotPrev >= 0 {
		prev = append(prev, int64(c.sotPrev))
		for _, t := range o.prompt {
			prev = append(prev, int64(t))
		}
	}
	sotSeq = append(sotSeq, int64(c.sot))
	if c.multilingual {
		sotSeq = append(sotSeq, int64(o.language), int64(o.task))
	}
	return prev, sotSeq
}

// decodeWindow decodes the window whose encoder KV is in s.
func (e *Engine) decodeWindow(ctx context.Context, s *slot, o decodeOptions) (windowResult, error) {
	c := e.cfg
	prev, sotSeq := e.initialTokens(o)
	if _, err := s.start(ctx, append(prev, sotSeq...), nil); err != nil {
		return windowResult{}, err
	}
	res := windowResult{temperature: o.temperature}
	work := make([]float32, c.vocab)
	if c.noSpeech >= 0 {
		copy(work, s.rowLogits(len(prev)))
		res.noSpeechProb = math.Exp(float64(work[c.noSpeech]) - logSumExp(work))
	}
	copy(work, s.rowLogits(len(prev)+len(sotSeq)-1))
	var sum float64
	limit := min(sampleLen, c.maxTarget-s.past)
	for len(res.tokens) < limit {
		e.applyFilters(work, res.tokens)
		tok := argmax(work)
		if o.temperature > 0 {
			tok = sample(work, o.temperature, o.rng)
		}
		sum += float64(work[tok]) - logSumExp(work)
		if tok == c.eot {
			break
		}
		res.tokens = append(res.tokens, tok)
		if len(res.tokens) == limit {
			break
		}
		logits, err := s.step(ctx, []int64{int64(tok)}, false, nil)
		if err != nil {
			return windowResult{}, err
		}
		copy(work, logits)
	}
	res.avgLogprob = sum / float64(len(res.tokens)+1)
	res.compression = compressionRatio(e.textOf(res.tokens))
	return res, nil
}

// applyFilters masks the logits the way openai/whisper's logit filters do:
// SuppressBlank at the first step, SuppressTokens, then ApplyTimestampRules.
func (e *Engine) applyFilters(logits []float32, tokens []int) {
	c := e.cfg
	ninf := float32(math.Inf(-1))
	if len(tokens) == 0 {
		for _, t := range c.beginSuppress {
			if t >= 0 && t < len(logits) {
				logits[t] = ninf
			}
		}
	}
	for _, t := range c.suppress {
		if t >= 0 && t < len(logits) {
			logits[t] = ninf
		}
	}
	for _, t := range []int{c.sot, c.sotPrev, c.noSpeech, c.transcribe, c.translate, c.noTimestamps} {
		if t >= 0 {
			logits[t] = ninf
		}
	}
	tb := c.timestampBegin
	n := len(tokens)
	lastTS := n >= 1 && tokens[n-1] >= tb
	penultTS := n < 2 || tokens[n-2] >= tb
	if lastTS {
		if penultTS {
			fill(logits[tb:], ninf) // a pair closed: text must follow
		} else {
			fill(logits[:c.eot], ninf) // after text and one timestamp: timestamp or EOT
		}
	}
	for i := n - 1; i >= 0; i-- {
		if tokens[i] >= tb {
			// Timestamps never decrease; a new pair must start after the last.
			last := tokens[i]
			if !(lastTS && !penultTS) {
				last++
			}
			fill(logits[tb:min(last, len(logits))], ninf)
			break
		}
	}
	if n == 0 {
		fill(logits[:tb], ninf)
		if lim := tb + maxInitialTimestamp + 1; lim < len(logits) {
			fill(logits[lim:], ninf)
		}
	}
	// If the timestamps together are likelier than any text token, force one.
	lse := logSumExp(logits)
	tsLogprob := logSumExp(logits[tb:]) - lse
	maxText := math.Inf(-1)
	for _, v := range logits[:tb] {
		maxText = math.Max(maxText, float64(v))
	}
	if tsLogprob > maxText-lse {
		fill(logits[:tb], ninf)
	}
}

func fill(s []float32, v float32) {
	for i := range s {
		s[i] = v
	}
}

func argmax(x []float32) int {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return best
}

// logSumExp is log(sum(exp(x))), -Inf for an all -Inf x.
func logSumExp(x []float32) float64 {
	m := math.Inf(-1)
	for _, v := range x {
		m = math.Max(m, float64(v))
	}
	if math.IsInf(m, -1) {
		return m
	}
	var s float64
	for _, v := range x {
		s += math.Exp(float64(v) - m)
	}
	return m + math.Log(s)
}

// sample draws a token from softmax(logits / t).
func sample(logits []float32, t float32, rng *rand.Rand) int {
	m := math.Inf(-1)
	for _, v := range logits {
		m = math.Max(m, float64(v))
	}
	var total float64
	for _, v := range logits {
		total += math.Exp((float64(v) - m) / float64(t))
	}
	r := rng.Float64() * total
	for i, v := range logits {
		r -= math.Exp((float64(v) - m) / float64(t))
		if r <= 0 && !math.IsInf(float64(v), -1) {
			return i
		}
	}
	return argmax(logits)
}

// compressionRatio is len(text)/len(zlib(text)), Whisper's repetition
// measure.
func compressionRatio(text string) float64 {
	if text == "" {
		return 0
	}
	var b bytes.Buffer
	w := zlib.NewWriter(&b)
	w.Write([]byte(text))
	w.Close()
	return float64(len(text)) / float64(b.Len())
}

// textOf decodes the text tokens among tokens (timestamps are dropped).
func (e *Engine) textOf(tokens []int) string {
	ids := make([]int64, 0, len(tokens))
	for _, t := range tokens {
		if t < e.cfg.eot {
			ids = append(ids, int64(t))
		}
	}
	return e.tok.Decode(ids, true)
}
