package tokenizer

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// TestLossyUTF8MatchesPython checks LossyUTF8 against outputs of
// /usr/bin/python3's bytes.decode("utf-8", errors="replace"), committed in
// testdata/lossy_utf8.json, and that decoding in pieces (as DecodeStream
// does) gives the same text wherever the input is cut.
func TestLossyUTF8MatchesPython(t *testing.T) {
	data, err := os.ReadFile("testdata/lossy_utf8.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct{ Hex, Want string }
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	if len(cases) < 30 {
		t.Fatalf("only %d vectors", len(cases))
	}
	for _, c := range cases {
		b, err := hex.DecodeString(c.Hex)
		if err != nil {
			t.Fatal(err)
		}
		if got := LossyUTF8(b); got != c.Want {
			t.Errorf("LossyUTF8(%x) = %q, want %q", b, got, c.Want)
		}
		if got := lossyString(string(b)); got != c.Want {
			t.Errorf("lossyString(%x) = %q, want %q", b, got, c.Want)
		}
		for cut := 0; cut <= len(b); cut++ {
			var sb strings.Builder
			pending := []byte(nil)
			for _, part := range [][]byte{b[:cut], b[cut:]} {
				pending = append(pending, part...)
				s, n := lossyPrefix(pending, false)
				sb.WriteString(s)
				pending = pending[n:]
			}
			s, _ := lossyPrefix(pending, true)
			sb.WriteString(s)
			if sb.String() != c.Want {
				t.Errorf("cut %x at %d: %q, want %q", b, cut, sb.String(), c.Want)
			}
		}
	}
}

func TestDecodeOneReplacementPerInvalidSequence(t *testing.T) {
	tok := loadBPE(t, nil)
	// E2 82 is a truncated "€": Python gives one U+FFFD, not two.
	ids := []int64{'a', 0xE2, 0x82, 'b', 0xED, 0xA0, 0x80}
	if got, want := tok.Decode(ids, false), "a\uFFFDb\uFFFD\uFFFD\uFFFD"; got != want {
		t.Fatalf("Decode = %q, want %q", got, want)
	}
	d := tok.NewDecodeStream(false)
	var sb strings.Builder
	for _, id := range ids {
		sb.WriteString(d.Add(id))
	}
	sb.WriteString(d.Flush())
	if got := sb.String(); got != "a\uFFFDb\uFFFD\uFFFD\uFFFD" {
		t.Fatalf("stream = %q", got)
	}
	enc, err := tok.EncodeContent("x\xe2\x82y")
	if err != nil {
		t.Fatal(err)
	}
	if got := tok.Decode(enc, false); got != "x\uFFFDy" {
		t.Fatalf("Encode of invalid text decodes to %q, want one U+FFFD", got)
	}
}
