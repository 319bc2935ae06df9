package audit

import (
	"bytes"
	"crypto/ed25519"
	"testing"
	"time"
)

// FuzzParseEntry feeds arbitrary lines to the record decoder: it must not
// panic, and whatever it accepts must re-encode to exactly the input (the
// canonical-only rule that makes a changed byte detectable).
func FuzzParseEntry(f *testing.F) {
	key := testKey("fuzz")
	for i, r := range []Record{rec(1), rec(2), {Endpoint: "/v1/vision/detections", Model: "m\"\n\x01é", Status: 500}} {
		e := Entry{Record: r.normalize(time.Unix(1e9, 0)), Node: "node-1", Seq: uint64(i + 1), Prev: Genesis("node-1")}
		f.Add(e.Sign(key, nil))
	}
	f.Add([]byte(`{"v":1}`))
	f.Add([]byte(`{"v":1,"node":"a","seq":1,"time":"2026-01-31T12:00:00Z","status":200,"duration_ms":1.000,"prev":"00","sig":"00"}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		e, err := ParseEntry(line)
		if err != nil {
			return
		}
		if out := e.AppendLine(nil); !bytes.Equal(out, line) {
			t.Fatalf("accepted a non-canonical line:\n in  %q\n out %q", line, out)
		}
		// Verification of an accepted line never panics either.
		Verify(bytes.NewReader(append(line, '\n')), map[string]ed25519.PublicKey{e.Node: pubOf(key)})
	})
}
