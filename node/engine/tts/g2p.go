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
// kept (after mapping to the model's vocabulary), besides every clause
// mark espeak-ng splits a line on (isClauseMark).
const punctRunes = ";:,.!?¡¿—–…\"«»“”(){}[]"

// isClauseMark reports whether espeak-ng ends a clause at r: every
// Unicode terminal punctuation mark (. , : ; ! ? and the CJK, fullwidth,
// Arabic, Devanagari, Ethiopic... forms: 。、！？．，：；｡､؟۔।…),
// which espeak-ng splits on even without a space after it, and the
// dashes. Fed to espeak-ng such a mark would split its answer into more
// lines than it was given (see espeak), so they are all cut out first.
func isClauseMark(r rune) bool {
	return strings.ContainsRune(punctRunes, r) || unicode.Is(unicode.Terminal_Punctuation, r)
}

// asciiPunct maps the clause marks of other scripts to the ASCII mark the
// models know (。→. 、→, ！→! ...); others are kept.
var asciiPunct = strings.NewReplacer(
	"。", ".", "．", ".", "｡", ".", "﹒", ".", "।", ".", "॥", ".", "۔", ".", "։", ".", "።", ".", "︒", ".",
	"、", ",", "，", ",", "､", ",", "،", ",", "፣", ",", "﹐", ",", "︐", ",",
	"！", "!", "‼", "!", "﹗", "!", "︕", "!",
	"？", "?", "⁇", "?", "؟", "?", "﹖", "?", "︖", "?", "፧", "?",
	"：", ":", "፥", ":", "；", ";", "؛", ";", "፤", ";", "–", "—",
)

// maxPunctRun is the most marks one punctuation piece keeps ("!!!!!!" is
// said like "!!!"): a text of nothing but marks costs no more than its
// words.
const maxPunctRun = 3

// maxLineRunes bounds one line given to espeak-ng: it splits a clause
// longer than about 700 characters into several lines on its own, so
// longer word runs are cut (at spaces where they have them) first.
const maxLineRunes = 300

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
	if !isClauseMark(r) {
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
// around punctuation go with the punctuation piece, collapsed to one;
// marks of other scripts become their ASCII form and a piece keeps at
// most maxPunctRun marks. A word run longer than maxLineRunes becomes
// several word pieces.
func splitPieces(s string) []piece {
	rs := []rune(s)
	var out []piece
	var cur []rune
	curPunct := false
	flush := func() {
		if len(cur) == 0 {
			return
		}
		if curPunct {
			if t := punctPiece(string(cur)); t != "" {
				out = append(out, piece{Text: t, Punct: true})
			}
		} else {
			for _, w := range splitRunes(cur, maxLineRunes) {
				if t := strings.TrimSpace(string(w)); t != "" {
					out = append(out, piece{Text: t})
				}
			}
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

// punctPiece is the text of a punctuation piece: ASCII marks, spaces
// collapsed, at most maxPunctRun marks (the first ones).
func punctPiece(s string) string {
	s = collapseSpaces(asciiPunct.Replace(s))
	var b strings.Builder
	marks := 0
	for _, r := range s {
		if r != ' ' {
			if marks == maxPunctRun {
				continue
			}
			marks++
		}
		b.WriteRune(r)
	}
	return b.String()
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

// splitSentences cuts text at sentence ends and at line breaks. A
// sentence ends after a sentence mark (isSentenceEnd: . ! ? … and the
// other scripts' 。！？．｡؟۔।‼...) and any closing quotes, brackets or
// further marks; an ASCII mark or '…' only when white space (or the end)
// follows ("3.5", "e.g.x" do not end one), any other without. A period
// after a single letter or a short capitalised word ("Dr.", "Mrs.",
// "U.S.") does not end a sentence, so espeak-ng sees the abbreviation
// whole.
func splitSentences(text string) []string {
	var out []string
	for _, para := range strings.Split(text, "\n") {
		rs := []rune(para)
		start := 0
		for i := 0; i < len(rs); i++ {
			r := rs[i]
			if !isSentenceEnd(r) {
				continue
			}
			j := i + 1
			for j < len(rs) && (isSentenceEnd(rs[j]) || strings.ContainsRune("\"”»)]'」』）】", rs[j])) {
				j++
			}
			if j < len(rs) && !unicode.IsSpace(rs[j]) && (r < utf8.RuneSelf || r == '…') {
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

// isSentenceEnd reports whether r ends a sentence: '…' and every Unicode
// sentence terminal.
func isSentenceEnd(r rune) bool {
	return r == '…' || unicode.Is(unicode.Sentence_Terminal, r)
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

// phonemizeSentences runs espeak-ng once on the word pieces of all the
// sentences (one line each) and returns each sentence as raw IPA with its
// punctuation pieces kept in place: "" for a sentence without words,
// which has nothing to say.
func phonemizeSentences(ctx context.Context, voice string, sentences [][]piece) ([]string, error) {
	var lines []string
	for _, ps := range sentences {
		for _, p := range ps {
			if !p.Punct {
				lines = append(lines, strings.ReplaceAll(p.Text, "\n", " "))
			}
		}
	}
	ipa, err := espeak(ctx, voice, lines)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(sentences))
	k := 0
	for i, ps := range sentences {
		var b strings.Builder
		words, prevWord := false, false
		for _, p := range ps {
			if p.Punct {
				b.WriteString(p.Text)
				prevWord = false
				continue
			}
			if prevWord {
				b.WriteByte(' ') // a long word run cut in two
			}
			b.WriteString(strings.TrimSpace(langFlag.ReplaceAllString(ipa[k], "")))
			k++
			words, prevWord = true, true
		}
		if words {
			out[i] = strings.TrimSpace(b.String())
		}
	}
	return out, nil
}
