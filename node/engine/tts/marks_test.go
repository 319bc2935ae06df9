package tts

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/infermesh/infermesh/node/engine"
)

// clauseMarks are every rune isClauseMark accepts: the Unicode terminal
// punctuation and punctRunes.
func clauseMarks() []rune {
	var out []rune
	for _, rg := range unicode.Terminal_Punctuation.R16 {
		for r := rune(rg.Lo); r <= rune(rg.Hi); r += rune(rg.Stride) {
			out = append(out, r)
		}
	}
	for _, rg := range unicode.Terminal_Punctuation.R32 {
		for r := rune(rg.Lo); r <= rune(rg.Hi); r += rune(rg.Stride) {
			out = append(out, r)
		}
	}
	return append(out, []rune(punctRunes)...)
}

// TestEspeakGetsOneLinePerPiece runs the real espeak-ng: it splits a line
// at a clause mark (、 here) into two answer lines, which used to send
// every piece of the sentence to a process of its own. With every mark
// it splits on cut out first, and word runs cut to maxLineRunes, one call
// on the word pieces of text around every terminal punctuation mark of
// Unicode (with and without spaces) and of a 4000-character run of words
// answers exactly one line per piece.
func TestEspeakGetsOneLinePerPiece(t *testing.T) {
	ctx := context.Background()
	raw, err := runEspeak(ctx, "en-us", "hello、world\n")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(raw, "\n"); n != 2 {
		t.Fatalf("espeak-ng answered %d lines for one line with 、; the check below would prove nothing", n)
	}
	var lines []string
	add := func(text string) {
		for _, p := range splitPieces(text) {
			if !p.Punct {
				lines = append(lines, p.Text)
			}
		}
	}
	marks := clauseMarks()
	for _, m := range marks {
		add("hello" + string(m) + "world again")
		add("one " + string(m) + " two")
	}
	add(strings.Repeat("extraordinarily ", 250))
	add(strings.Repeat("a", 3000))
	out, err := runEspeak(ctx, "en-us", strings.Join(lines, "\n")+"\n")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(out, "\n"); got != len(lines) {
		t.Fatalf("espeak-ng answered %d lines for %d pieces (%d marks)", got, len(lines), len(marks))
	}
}

// TestSplitSentencesAtEveryMark: the sentence marks of other scripts end
// a sentence without a space after them; ASCII ones need the space.
func TestSplitSentencesAtEveryMark(t *testing.T) {
	for text, want := range map[string][]string{
		"今日は。明日は！本当？はい．終わり": {"今日は。", "明日は！", "本当？", "はい．", "終わり"},
		"Hello。World！":                {"Hello。", "World！"},
		"It costs 3.5 dollars. Next.": {"It costs 3.5 dollars.", "Next."},
		"e.g.x is fine":               {"e.g.x is fine"},
		"Dr. Smith came. Wait… ok":    {"Dr. Smith came.", "Wait…", "ok"},
		"「はい。」次。":                     {"「はい。」", "次。"},
		"क्या है। ठीक":                {"क्या है।", "ठीक"},
	} {
		if got := splitSentences(text); !slices.Equal(got, want) {
			t.Errorf("splitSentences(%q) = %q, want %q", text, got, want)
		}
	}
}

// TestPunctuationPieces: marks of other scripts become the ASCII marks the
// models know, and a run of marks keeps three.
func TestPunctuationPieces(t *testing.T) {
	for text, want := range map[string][]piece{
		"Wow!!!!!!!! Really":      {{Text: "Wow"}, {Text: "!!! ", Punct: true}, {Text: "Really"}},
		"はい、そう。":                  {{Text: "はい"}, {Text: ",", Punct: true}, {Text: "そう"}, {Text: ".", Punct: true}},
		"one – two":               {{Text: "one"}, {Text: " — ", Punct: true}, {Text: "two"}},
		strings.Repeat(".", 4096): {{Text: "...", Punct: true}},
	} {
		if got := splitPieces(text); !slices.Equal(got, want) {
			t.Errorf("splitPieces(%.40q) = %+v, want %+v", text, got, want)
		}
	}
}

// TestChunkSentences: the first sentence alone, then chunks of at most
// chunkRunes runes, every sentence once and in order: 585 sentences of
// "Hello." take 3 espeak-ng processes.
func TestChunkSentences(t *testing.T) {
	ss := splitSentences(strings.Repeat("Hello. ", 585))
	if len(ss) != 585 {
		t.Fatalf("%d sentences", len(ss))
	}
	chunks := chunkSentences(ss)
	if len(chunks) != 3 || len(chunks[0]) != 1 {
		t.Fatalf("%d chunks (first of %d sentences), want 3 with the first alone", len(chunks), len(chunks[0]))
	}
	var all []string
	for _, c := range chunks {
		n := 0
		for _, s := range c {
			n += len([]rune(s))
		}
		if n > chunkRunes && len(c) > 1 {
			t.Fatalf("a chunk of %d runes", n)
		}
		all = append(all, c...)
	}
	if !slices.Equal(all, ss) {
		t.Fatal("chunks do not give back the sentences in order")
	}
}

// testKokoroMarksOnly: a text of marks only (the 4096 full stops,
// and the same with spaces, ideographic and fullwidth ones) is an
// InputError before any model run; marks between words still pause.
func testKokoroMarksOnly(t *testing.T, k *Kokoro) {
	for _, text := range []string{strings.Repeat(".", 4096), strings.Repeat(". ", 2048), strings.Repeat("。", 4096),
		strings.Repeat("．", 4096), strings.Repeat("！？", 2048), "…"} {
		start := k.m.calls.Load()
		called := false
		err := k.Synthesize(context.Background(), engine.SpeechRequest{Text: text}, func([]float32) error { called = true; return nil })
		var ie *engine.InputError
		if !errors.As(err, &ie) || ie.Param != "input" || called {
			t.Errorf("%.12q x %d: %v (emitted %v), want an InputError on input", text, len([]rune(text)), err, called)
		}
		if n := k.m.calls.Load() - start; n != 0 {
			t.Errorf("%.12q: %d model runs", text, n)
		}
	}
	ph, err := k.Phonemes(context.Background(), "Hello。World！Yes", "af_heart")
	if err != nil {
		t.Fatal(err)
	}
	if want := "həlˈO. wˈɜːld! jˈɛs"; ph != want {
		t.Errorf("phonemes %q, want %q", ph, want)
	}
	_, chunks := synthAll(t, k, engine.SpeechRequest{Text: "Hello。World！Yes"})
	if chunks != 3 {
		t.Errorf("%d chunks for three sentences", chunks)
	}
}
