package tts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Grapheme-to-phoneme conversion with espeak-ng.
//
// espeak-ng is GPL-3, so it is run as a separate program (never linked):
// `espeak-ng -q -b 1 --ipa=3 -v <voice>` with the text on stdin, one piece
// per line, under a timeout and with bounded output. espeak-ng does the text
// normalisation itself (numbers, dates, currency, common abbreviations such
// as "Dr.", symbols like "%" and "&"). In line mode it writes one line of
// IPA per input line, which keeps the pieces aligned with the punctuation
// between them; if the line count ever differs (a clause espeak-ng splits on
// its own), each piece is phonemized by its own call instead.
//
// Punctuation is not given to espeak-ng (it drops it): the text is cut at
// punctuation, the words are phonemized and the punctuation is put back,
// because the acoustic models use it for pauses and intonation.

// espeakTimeout bounds one espeak-ng call.
const espeakTimeout = 10 * time.Second

// EspeakProgram is the G2P executable looked up on PATH (Debian package
// espeak-ng; the container image installs it).
const EspeakProgram = "espeak-ng"

// zwj is the tie espeak-ng --ipa=3 puts inside multi-letter phonemes.
const zwj = "\u200d"

// punctRunes are the characters cut out of the text before espeak-ng and
// kept as they are (after mapping to the model's vocabulary).
const punctRunes = ";:,.!?¡¿—…\"«»“”(){}[]"

// langFlag matches espeak-ng's language-switch marks such as "(en)".
var langFlag = regexp.MustCompile(`\([a-z\x{200d}-]+\)`)

// piece is a run of words (Punct false) or of punctuation and the spaces
// around it (Punct true).
type piece struct {
	Text  string
	Punct bool
}

// isPunct reports whether text[i] (rune r) is cutting punctuation; '.', ','
// and ':' between digits (3.5, 1,000, 3:45) belong to the number.
func isPunct(rs []rune, i int) bool {
	r := rs[i]
	if !strings.ContainsRune(punctRunes, r) {
		return false
	}
	if (r == '.' || r == ',' || r == ':') && i > 0 && i+1 < len(rs) && unicode.IsDigit(rs[i-1]) && unicode.IsDigit(rs[i+1]) {
		return false
	}
	// The period of an abbreviation inside a sentence ("Dr. Smith") stays
	// with the word so that espeak-ng expands it.
	if r == '.' && i+2 < len(rs) && unicode.IsSpace(rs[i+1]) && isAbbreviation(rs[:i]) {
		return false
	}
	return true
}

// splitPieces cuts a sentence into word and punctuation pieces. Spaces
// around punctuation go with the punctuation piece, collapsed to one.
func splitPieces(s string) []piece {
	rs := []rune(s)
	var out []piece
	var cur []rune
	curPunct := false
	flush := func() {
		if len(cur) == 0 {
			return
		}
		t := string(cur)
		if curPunct {
			t = collapseSpaces(t)
		} else {
			t = strings.TrimSpace(t)
		}
		if t != "" {
			out = append(out, piece{Text: t, Punct: curPunct})
		}
		cur = cur[:0]
	}
	for i, r := range rs {
		p := isPunct(rs, i)
		if unicode.IsSpace(r) {
			// Spaces after punctuation stay with it; before it they are
			// moved to it when the punctuation comes.
			p = curPunct || nextIsPunct(rs, i)
		}
		if p != curPunct {
			flush()
			curPunct = p
		}
		cur = append(cur, r)
	}
	flush()
	return out
}

// nextIsPunct reports whether the first non-space rune after i is
// punctuation.
func nextIsPunct(rs []rune, i int) bool {
	for j := i + 1; j < len(rs); j++ {
		if !unicode.IsSpace(rs[j]) {
			return isPunct(rs, j)
		}
	}
	return false
}

// collapseSpaces turns every run of white space into one space.
func collapseSpaces(s string) string {
	var b strings.Builder
	sp := false
	for _, r := range s {
		if unicode.IsSpace(r) {
			if !sp {
				b.WriteByte(' ')
			}
			sp = true
			continue
		}
		sp = false
		b.WriteRune(r)
	}
	return b.String()
}

// splitSentences cuts text at sentence ends: '.', '!', '?' or '…' (with any
// closing quotes or brackets) followed by white space, and at line breaks.
// A period after a single letter or a short capitalised word ("Dr.",
// "Mrs.", "U.S.") does not end a sentence, so espeak-ng sees the
// abbreviation whole.
func splitSentences(text string) []string {
	var out []string
	for _, para := range strings.Split(text, "\n") {
		rs := []rune(para)
		start := 0
		for i := 0; i < len(rs); i++ {
			r := rs[i]
			if r != '.' && r != '!' && r != '?' && r != '…' {
				continue
			}
			j := i + 1
			for j < len(rs) && strings.ContainsRune(".!?…\"”»)]'", rs[j]) {
				j++
			}
			if j < len(rs) && !unicode.IsSpace(rs[j]) {
				continue
			}
			if r == '.' && isAbbreviation(rs[start:i]) {
				continue
			}
			if s := strings.TrimSpace(string(rs[start:j])); s != "" {
				out = append(out, s)
			}
			start = j
			i = j - 1
		}
		if s := strings.TrimSpace(string(rs[start:])); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// isAbbreviation reports whether the word at the end of rs looks like an
// abbreviation: one letter, or an upper-case letter followed by at most
// two lower-case letters.
func isAbbreviation(rs []rune) bool {
	k := len(rs)
	for k > 0 && unicode.IsLetter(rs[k-1]) {
		k--
	}
	w := rs[k:]
	if len(w) == 0 || len(w) > 3 {
		return false
	}
	if len(w) == 1 {
		return true
	}
	if !unicode.IsUpper(w[0]) {
		return false
	}
	for _, r := range w[1:] {
		if !unicode.IsLower(r) {
			return false
		}
	}
	return true
}

// espeak phonemizes lines (no line may contain a newline) with the given
// espeak-ng voice and returns one IPA string per line. Output is bounded
// to 64 bytes per input byte plus 4 KiB.
func espeak(ctx context.Context, voice string, lines []string) ([]string, error) {
	if len(lines) == 0 {
		return nil, nil
	}
	in := strings.Join(lines, "\n") + "\n"
	out, err := runEspeak(ctx, voice, in)
	if err != nil {
		return nil, err
	}
	got := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(got) == len(lines) {
		return got, nil
	}
	// espeak-ng split a line on its own: phonemize line by line.
	res := make([]string, len(lines))
	for i, l := range lines {
		o, err := runEspeak(ctx, voice, l+"\n")
		if err != nil {
			return nil, err
		}
		res[i] = strings.Join(strings.Fields(strings.ReplaceAll(o, "\n", " ")), " ")
	}
	return res, nil
}

// errOutputLimit is returned when espeak-ng writes more than allowed.
var errOutputLimit = errors.New("espeak-ng output over the limit")

// limitedBuffer is a bytes.Buffer that refuses to grow past max.
type limitedBuffer struct {
	buf bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if b.buf.Len()+len(p) > b.max {
		return 0, errOutputLimit
	}
	return b.buf.Write(p)
}

func runEspeak(parent context.Context, voice, in string) (string, error) {
	ctx, cancel := context.WithTimeout(parent, espeakTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, EspeakProgram, "-q", "-b", "1", "--ipa=3", "-v", voice)
	cmd.Stdin = strings.NewReader(in)
	out := &limitedBuffer{max: 64*len(in) + 4096}
	var stderr limitedBuffer
	stderr.max = 4096
	cmd.Stdout = out
	cmd.Stderr = &stderr
	cmd.WaitDelay = time.Second
	if err := cmd.Run(); err != nil {
		if perr := parent.Err(); perr != nil {
			return "", perr
		}
		if ctx.Err() != nil {
			return "", fmt.Errorf("tts: espeak-ng timed out after %v", espeakTimeout)
		}
		return "", fmt.Errorf("tts: espeak-ng -v %s: %w: %s", voice, err, strings.TrimSpace(stderr.buf.String()))
	}
	if !utf8.Valid(out.buf.Bytes()) {
		return "", errors.New("tts: espeak-ng wrote invalid UTF-8")
	}
	return out.buf.String(), nil
}

// phonemizePieces runs espeak-ng on the word pieces and returns the
// sentence as raw IPA with the punctuation pieces kept in place.
func phonemizePieces(ctx context.Context, voice string, ps []piece) (string, error) {
	var lines []string
	for _, p := range ps {
		if !p.Punct {
			lines = append(lines, strings.ReplaceAll(p.Text, "\n", " "))
		}
	}
	ipa, err := espeak(ctx, voice, lines)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	k := 0
	for _, p := range ps {
		if p.Punct {
			b.WriteString(p.Text)
			continue
		}
		s := langFlag.ReplaceAllString(ipa[k], "")
		k++
		b.WriteString(strings.TrimSpace(s))
	}
	return strings.TrimSpace(b.String()), nil
}
