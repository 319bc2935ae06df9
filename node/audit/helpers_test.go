package audit

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"errors"
	"fmt"
	"testing"
	"time"
)

// testKey derives a fixed key from a name, so tests are repeatable.
func testKey(name string) ed25519.PrivateKey {
	seed := sha256.Sum256([]byte("audit test key " + name))
	return ed25519.NewKeyFromSeed(seed[:])
}

func pubOf(k ed25519.PrivateKey) ed25519.PublicKey { return k.Public().(ed25519.PublicKey) }

// openLog opens a log for node in dir with the node's test key.
func openLog(t testing.TB, dir, node string, opts Options) *Log {
	t.Helper()
	opts.NodeID = node
	if opts.Key == nil {
		opts.Key = testKey(node)
	}
	l, err := Open(dir, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// rec is a typical chat record number i.
func rec(i int) Record {
	return Record{
		Time:      time.Date(2026, 1, 31, 12, 0, 0, 0, time.UTC).Add(time.Duration(i) * time.Second),
		Endpoint:  "/v1/chat/completions",
		Model:     "tiny-llama",
		KeyID:     fmt.Sprintf("key-%d", i%3),
		App:       "notes",
		Worker:    "b",
		Status:    200,
		Duration:  time.Duration(i)*time.Millisecond + 250*time.Microsecond,
		RequestID: fmt.Sprintf("req-%04d", i),
	}
}

// appendN appends n records numbered from first and flushes.
func appendN(t testing.TB, l *Log, first, n int) {
	t.Helper()
	for i := first; i < first+n; i++ {
		if !l.Append(rec(i)) {
			t.Fatalf("Append %d dropped", i)
		}
	}
	flush(t, l)
}

func flush(t testing.TB, l *Log) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := l.Flush(ctx); err != nil {
		t.Fatalf("Flush: %v", err)
	}
}

// export returns the whole log as bytes.
func export(t testing.TB, l *Log) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := l.Export(time.Time{}, &b); err != nil {
		t.Fatalf("Export: %v", err)
	}
	return b.Bytes()
}

// lines splits an export into lines without newlines.
func lines(b []byte) [][]byte {
	return bytes.Split(bytes.TrimSuffix(b, []byte{'\n'}), []byte{'\n'})
}

// join makes an export from lines.
func join(ls [][]byte) []byte {
	var b bytes.Buffer
	for _, l := range ls {
		b.Write(l)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// mustVerify verifies data and fails the test on any error.
func mustVerify(t testing.TB, data []byte, keys map[string]ed25519.PublicKey) Report {
	t.Helper()
	rep, err := Verify(bytes.NewReader(data), keys)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	return rep
}

// badLine verifies data, expects a *VerifyError and returns its line.
func badLine(t testing.TB, data []byte, keys map[string]ed25519.PublicKey) (int, string) {
	t.Helper()
	_, err := Verify(bytes.NewReader(data), keys)
	var ve *VerifyError
	if !errors.As(err, &ve) {
		t.Fatalf("Verify: want a VerifyError, got %v", err)
	}
	return ve.Line, ve.Reason
}
