package whisper

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/infermesh/infermesh/node/engine"
)

// Request bounds.
const (
	// MaxPromptTokens is how much of the prompt (and of the previous
	// windows' text) conditions a window: n_text_ctx/2 - 1, as Whisper.
	MaxPromptTokens = 223
	// maxPromptBytes bounds the prompt text read at all.
	maxPromptBytes = 16 << 10
)

// Transcribe implements engine.Transcriber with openai/whisper's
// long-form algorithm: 30 s windows; a window's end is the last complete
// timestamp pair, where the next window starts; each window is decoded
// greedily with timestamps, and decoded again hotter when the result is
// too repetitive (compression ratio > 2.4) or too unlikely (average log
// probability < -1) unless the model says there is no speech; windows the
// model deems silent are skipped; the previous windows' text conditions
// the next one (reset after a window decoded above temperature 0.5).
func (e *Engine) Transcribe(ctx context.Context, req engine.TranscribeRequest, onSegment func(engine.Segment)) (engine.Transcript, error) {
	c := e.cfg
	if len(req.Samples) == 0 {
		return engine.Transcript{}, &engine.InputError{Param: "file", Msg: "the audio is empty"}
	}
	for _, v := range req.Samples {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return engine.Transcript{}, &engine.InputError{Param: "file", Msg: "the audio has non-finite samples"}
		}
	}
	if req.Temperature < 0 || req.Temperature > 1 || math.IsNaN(float64(req.Temperature)) {
		return engine.Transcript{}, &engine.InputError{Param: "temperature", Msg: "temperature must be between 0 and 1"}
	}
	if len(req.Prompt) > maxPromptBytes {
		return engine.Transcript{}, &engine.InputError{Param: "prompt", Msg: fmt.Sprintf("prompt is longer than %d bytes", maxPromptBytes)}
	}
	lang := strings.ToLower(strings.TrimSpace(req.Language))
	langTok, taskTok := -1, -1
	if c.multilingual {
		taskTok = c.transcribe
		if req.Translate {
			taskTok = c.translate
		}
		if lang != "" {
			id, ok := c.langToID[lang]
			if !ok {
				return engine.Transcript{}, &engine.InputError{Param: "language", Msg: fmt.Sprintf("language %q is not supported by %s", req.Language, e.id)}
			}
			langTok = id
		}
	} else if lang != "" && lang != "en" {
		return engine.Transcript{}, &engine.InputError{Param: "language", Msg: fmt.Sprintf("%s is English-only", e.id)}
	} else {
		lang = "en"
	}
	var history []int
	if p := strings.TrimSpace(req.Prompt); p != "" {
		ids, err := e.tok.EncodeContent(" " + p)
		if err != nil {
			return engine.Transcript{}, &engine.InputError{Param: "prompt", Msg: err.Error()}
		}
		for _, id := range ids {
			history = append(history, int(id))
		}
	}

	s, err := e.acquire(ctx)
	if err != nil {
		return engine.Transcript{}, err
	}
	defer func() { e.slots <- s }()

	temps := fallbackTemperatures[:]
	if req.Temperature > 0 {
		temps = []float32{req.Temperature}
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(len(req.Samples))))
	out := engine.Transcript{Duration: float64(len(req.Samples)) / sampleRate}
	contentFrames := len(req.Samples) / hopLength
	promptSince := 0
	var text strings.Builder
	for seek := 0; seek < contentFrames; {
		e.mel.compute(req.Samples, seek, s.mel)
		if err := s.encode(ctx); err != nil {
			return engine.Transcript{}, err
		}
		if c.multilingual && langTok < 0 {
			langLogits, err := s.prime(ctx)
			if err != nil {
				return engine.Transcript{}, err
			}
			langTok, lang = e.detectLanguage(langLogits)
		}
		segSize := min(nFrames, contentFrames-seek)
		offset := float64(seek*hopLength) / sampleRate
		prompt := history[promptSince:]
		if len(prompt) > MaxPromptTokens {
			prompt = prompt[len(prompt)-MaxPromptTokens:]
		}
		var res windowResult
		for i, t := range temps {
			res, err = e.decodeWindow(ctx, s, decodeOptions{prompt: prompt, language: langTok, task: taskTok, temperature: t, rng: rng})
			if err != nil {
				return engine.Transcript{}, err
			}
			fallback := res.compression > compressionRatioThreshold || res.avgLogprob < logprobThreshold
			if res.noSpeechProb > noSpeechThreshold && res.avgLogprob < logprobThreshold {
				fallback = false // silence
			}
			if !fallback || i == len(temps)-1 {
				break
			}
		}
		if res.noSpeechProb > noSpeechThreshold && res.avgLogprob < logprobThreshold {
			seek += segSize
			continue
		}
		segs, advance := e.split(res, offset, segSize)
		if req.WordTimestamps && e.words {
			words, err := e.alignWords(ctx, s, res, segs, langTok, taskTok, offset, segSize)
			if err != nil {
				return engine.Transcript{}, err
			}
			out.Words = append(out.Words, words...)
		}
		for _, sg := range segs {
			sg.ID = len(out.Segments)
			if n := len(out.Segments); n > 0 && sg.Start < out.Segments[n-1].End {
				sg.Start = out.Segments[n-1].End
			}
			sg.End = min(max(sg.End, sg.Start), out.Duration)
			sg.Start = min(sg.Start, sg.End)
			out.Segments = append(out.Segments, sg)
			text.WriteString(sg.Text)
			if onSegment != nil {
				onSegment(sg)
			}
		}
		for _, t := range res.tokens {
			if t < c.eot {
				out.Tokens++
			}
		}
		if res.temperature > 0.5 {
			promptSince = len(history)
		}
		for _, t := range res.tokens {
			if t < c.eot {
				history = append(history, t)
			}
		}
		seek += max(1, min(advance, segSize))
	}
	out.Text = strings.TrimSpace(text.String())
	out.Language = lang
	return out, nil
}

// detectLanguage picks the likeliest language token after SOT.
func (e *Engine) detectLanguage(logits []float32) (int, string) {
	bestTok, bestCode := -1, ""
	for code, id := range e.cfg.langToID {
		if bestTok < 0 || logits[id] > logits[bestTok] || (logits[id] == logits[bestTok] && code < bestCode) {
			bestTok, bestCode = id, code
		}
	}
	return bestTok, bestCode
}

// split cuts a window's tokens into segments at consecutive timestamp
// pairs and returns them with the number of frames to advance.
func (e *Engine) split(res windowResult, offset float64, segSize int) ([]engine.Segment, int) {
	tb := e.cfg.timestampBegin
	toks := res.tokens
	isTS := func(i int) bool { return toks[i] >= tb }
	n := len(toks)
	singleEnding := n >= 2 && !isTS(n-2) && isTS(n-1)
	var cuts []int
	for i := 1; i < n; i++ {
		if isTS(i-1) && isTS(i) {
			cuts = append(cuts, i)
		}
	}
	mk := func(start, end float64, sl []int) (engine.Segment, bool) {
		var text []int
		for _, t := range sl {
			if t < e.cfg.eot {
				text = append(text, t)
			}
		}
		txt := e.textOf(text)
		if strings.TrimSpace(txt) == "" {
			return engine.Segment{}, false
		}
		return engine.Segment{
			Start: start, End: end, Text: txt, Tokens: text,
			AvgLogprob: res.avgLogprob, CompressionRatio: res.compression,
			NoSpeechProb: res.noSpeechProb, Temperature: res.temperature,
		}, true
	}
	var segs []engine.Segment
	if len(cuts) > 0 {
		if singleEnding {
			cuts = append(cuts, n)
		}
		last := 0
		for _, cur := range cuts {
			sl := toks[last:cur]
			start := offset + float64(sl[0]-tb)*secondsPerTimestamp
			end := offset + float64(sl[len(sl)-1]-tb)*secondsPerTimestamp
			if sg, ok := mk(start, end, sl); ok {
				segs = append(segs, sg)
			}
			last = cur
		}
		if singleEnding {
			return segs, segSize
		}
		return segs, (toks[last-1] - tb) * framesPerTimestamp
	}
	dur := float64(segSize*hopLength) / sampleRate
	for i := n - 1; i >= 0; i-- {
		if isTS(i) {
			if toks[i] != tb {
				dur = float64(toks[i]-tb) * secondsPerTimestamp
			}
			break
		}
	}
	if sg, ok := mk(offset, offset+dur, toks); ok {
		segs = append(segs, sg)
	}
	return segs, segSize
}
