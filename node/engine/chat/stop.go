package chat

import "strings"

// StopBuffer finds stop sequences in streamed text, across token
// boundaries. It holds back the end of the text that could still begin a
// stop sequence, so nothing that turns out to be part of one is emitted.
type StopBuffer struct {
	stops []string
	held  string
	done  bool
}

// NewStopBuffer watches for the non-empty strings in stops.
func NewStopBuffer(stops []string) *StopBuffer {
	b := &StopBuffer{}
	for _, s := range stops {
		if s != "" {
			b.stops = append(b.stops, s)
		}
	}
	return b
}

// Push adds text and returns what can be emitted. stopped is true when a
// stop sequence matched: emit is then the text before it, and everything
// after is dropped.
func (b *StopBuffer) Push(text string) (emit string, stopped bool) {
	if b.done {
		return "", true
	}
	buf := b.held + text
	at := -1
	for _, s := range b.stops {
		if i := strings.Index(buf, s); i >= 0 && (at < 0 || i < at) {
			at = i
		}
	}
	if at >= 0 {
		b.held, b.done = "", true
		return buf[:at], true
	}
	keep := 0
	for _, s := range b.stops {
		for k := min(len(s)-1, len(buf)); k > keep; k-- {
			if strings.HasSuffix(buf, s[:k]) {
				keep = k
				break
			}
		}
	}
	b.held = buf[len(buf)-keep:]
	return buf[:len(buf)-keep], false
}

// Flush returns the held text at the end of generation.
func (b *StopBuffer) Flush() string {
	s := b.held
	b.held = ""
	return s
}
