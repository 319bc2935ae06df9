package tts

import (
	"context"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"github.com/infermesh/infermesh/node/engine"
)

// Joining chunks: every chunk's edges fade over fadeSeconds so that no cut
// clicks, and sentences are separated by sentenceGap seconds of silence
// (divided by the speed), put before the next chunk so the utterance does not
// end with added silence. Pieces of one over-long sentence are joined with
// the fades only.
const (
	fadeSeconds = 0.005
	sentenceGap = 0.08
)

// unit is one model run's worth of input: token ids without the model's
// padding, and whether a sentence ends with it.
type unit struct {
	ids         []int64
	sentenceEnd bool
}

// checkText validates the text and speed common to every request and
// returns the speed to use.
func checkText(text string, speed float32) (float32, error) {
	if strings.TrimSpace(text) == "" {
		return 0, &engine.InputError{Param: "input", Msg: "input is empty"}
	}
	if !utf8.ValidString(text) {
		return 0, &engine.InputError{Param: "input", Msg: "input is not valid UTF-8"}
	}
	if n := utf8.RuneCountInString(text); n > engine.MaxSpeechInput {
		return 0, &engine.InputError{Param: "input", Msg: fmt.Sprintf("input has %d characters; the limit is %d", n, engine.MaxSpeechInput)}
	}
	if speed == 0 {
		speed = 1
	}
	if math.IsNaN(float64(speed)) || speed < engine.MinSpeechSpeed || speed > engine.MaxSpeechSpeed {
		return 0, &engine.InputError{Param: "speed", Msg: fmt.Sprintf("speed must be between %g and %g", engine.MinSpeechSpeed, engine.MaxSpeechSpeed)}
	}
	return speed, nil
}

// unitOrErr is what the G2P goroutine sends.
type unitOrErr struct {
	u   unit
	err error
}

// chunkRunes bounds the text of the sentences phonemized by one
// espeak-ng process (see chunkSentences).
const chunkRunes = 2000

// chunkSentences groups sentences for one espeak-ng process each: the
// first sentence alone, so the first audio waits for no more, then as
// many as fit in chunkRunes runes (a longer sentence alone). Spawning
// espeak-ng costs more than phonemizing a sentence, so a text of many
// short sentences costs a few processes, not one per sentence.
func chunkSentences(sentences []string) [][]string {
	var out [][]string
	for i := 0; i < len(sentences); {
		j, n := i+1, utf8.RuneCountInString(sentences[i])
		for i > 0 && j < len(sentences) {
			m := utf8.RuneCountInString(sentences[j])
			if n+m > chunkRunes {
				break
			}
			n += m
			j++
		}
		out = append(out, sentences[i:j])
		i = j
	}
	return out
}

// prepareAhead runs prep on each chunk of sentences (chunkSentences) in a
// goroutine, one chunk ahead of the consumer, so espeak-ng works while
// the model runs. The channel closes after the last unit or after an
// error; cancelling ctx stops it.
func prepareAhead(ctx context.Context, sentences []string, prep func(context.Context, []string) ([]unit, error)) <-chan unitOrErr {
	ch := make(chan unitOrErr, 2)
	go func() {
		defer close(ch)
		for _, chunk := range chunkSentences(sentences) {
			us, err := prep(ctx, chunk)
			if err != nil {
				select {
				case ch <- unitOrErr{err: err}:
				case <-ctx.Done():
				}
				return
			}
			for _, u := range us {
				select {
				case ch <- unitOrErr{u: u}:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return ch
}

// errNothingToSay is the answer to a text without a word (only marks).
var errNothingToSay = &engine.InputError{Param: "input", Msg: "input has no words to speak"}

// speak synthesizes the units from ch in order and emits each chunk with
// faded edges, sentence gaps before all but the first.
func speak(ctx context.Context, ch <-chan unitOrErr, rate int, speed float32, synth func(context.Context, unit) ([]float32, error), emit func([]float32) error) error {
	fade := int(fadeSeconds * float64(rate))
	gap := int(sentenceGap * float64(rate) / float64(speed))
	first, afterSentence := true, false
	units := 0
	for ue := range ch {
		if ue.err != nil {
			return ue.err
		}
		units++
		pcm, err := synth(ctx, ue.u)
		if err != nil {
			return err
		}
		fadeEdges(pcm, fade)
		if !first && afterSentence && gap > 0 {
			pcm = append(make([]float32, gap, gap+len(pcm)), pcm...)
		}
		first, afterSentence = false, ue.u.sentenceEnd
		if len(pcm) == 0 {
			continue
		}
		if err := emit(pcm); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if units == 0 {
		return errNothingToSay
	}
	return nil
}

// fadeEdges ramps the first and last n samples in and out (raised cosine).
func fadeEdges(x []float32, n int) {
	if n > len(x)/2 {
		n = len(x) / 2
	}
	for i := range n {
		g := float32(0.5 - 0.5*math.Cos(math.Pi*float64(i)/float64(n)))
		x[i] *= g
		x[len(x)-1-i] *= g
	}
}

// splitRunes cuts s into pieces of at most max runes, preferring cuts after
// clause punctuation followed by a space, then at spaces, then anywhere.
// Each piece has its edge spaces trimmed.
func splitRunes(s []rune, max int) [][]rune {
	var out [][]rune
	for len(s) > max {
		cut := -1
		for i := max; i > max/3 && cut < 0; i-- {
			if s[i-1] == ' ' && i >= 2 && strings.ContainsRune(",;:—…", s[i-2]) {
				cut = i
			}
		}
		for i := max; i > max/3 && cut < 0; i-- {
			if s[i-1] == ' ' {
				cut = i
			}
		}
		if cut < 0 {
			cut = max
		}
		if p := trimRunes(s[:cut]); len(p) > 0 {
			out = append(out, p)
		}
		s = s[cut:]
	}
	if p := trimRunes(s); len(p) > 0 {
		out = append(out, p)
	}
	return out
}

func trimRunes(s []rune) []rune {
	for len(s) > 0 && s[0] == ' ' {
		s = s[1:]
	}
	for len(s) > 0 && s[len(s)-1] == ' ' {
		s = s[:len(s)-1]
	}
	return s
}
