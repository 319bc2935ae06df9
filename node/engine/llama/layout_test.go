package llama

import (
	"slices"
	"strings"
	"testing"
)

// openForLayout opens the library for the package's internal tests (the
// llamatest helper imports this package, so it cannot be used here).
func openForLayout(t *testing.T) *Lib {
	t.Helper()
	l, err := Open(testLibDir(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

// TestLayoutRefusesPublicHeader feeds checkStruct the library's own
// context defaults rearranged as the nearest release's public header lays
// them out (no 4-byte field at offset 24, 8 bytes less at the end): the
// check must refuse it and name the field that moved.
func TestLayoutRefusesPublicHeader(t *testing.T) {
	l := openForLayout(t)
	b := l.ctxParams().b
	if _, err := checkStruct("llama_context_params", b, ctxParamsSize, ctxParamsSize, ctxFields()); err != nil {
		t.Fatalf("the shipped layout itself fails: %v", err)
	}
	pub := slices.Concat(b[:24], b[28:88], b[88:152]) // drop offset 24, end at 152
	_, err := checkStruct("llama_context_params", pub, 152, ctxParamsSize, ctxFields())
	if err == nil {
		t.Fatal("a public-header layout passed the check")
	}
	if !strings.Contains(err.Error(), "bytes") && !strings.Contains(err.Error(), "n_threads") {
		t.Fatalf("error does not say what differs: %v", err)
	}
	// Same size, fields shifted: the field check itself must catch it.
	shifted := slices.Concat(b[:24], b[28:160], []byte{0, 0, 0, 0})
	_, err = checkStruct("llama_context_params", shifted, 160, ctxParamsSize, ctxFields())
	if err == nil || !strings.Contains(err.Error(), "n_threads") {
		t.Fatalf("shifted layout: want an error naming n_threads, got %v", err)
	}
	t.Logf("refused: %v", err)
}
