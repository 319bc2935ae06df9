package onnx

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"

	ort "github.com/yalue/onnxruntime_go"
)

func TestRunCancellable(t *testing.T) {
	testRuntime(t, Config{})
	opts, err := ort.NewRunOptions()
	if err != nil {
		t.Fatal(err)
	}
	defer opts.Destroy()

	sentinel := errors.New("run failed")
	calls := 0
	err = RunCancellable(context.Background(), opts, func() error { calls++; return sentinel })
	if err != sentinel || calls != 1 {
		t.Fatalf("got %v after %d calls, want the run's own error after 1", err, calls)
	}

	// Cancelled during the run: run's result is returned unchanged (the
	// caller decides whether ctx.Err() replaces it), and opts can be
	// destroyed or reused at once.
	for range 20 {
		ctx, cancel := context.WithCancel(context.Background())
		err = RunCancellable(ctx, opts, func() error { cancel(); return nil })
		if err != nil {
			t.Fatalf("cancelled during the run: got %v, want nil", err)
		}
	}
}

func TestReadSignature(t *testing.T) {
	testRuntime(t, Config{})
	dir := genTinyBERT(t)
	spec := tinyBERTSpec(t, dir, nil)
	ins, outs, err := ReadSignature(filepath.Join(dir, spec.Files["model"]))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, in := range ins {
		names = append(names, in.Name)
	}
	if !slices.Contains(names, inputIDs) || !slices.Contains(names, attentionMask) || len(outs) == 0 {
		t.Fatalf("inputs %v and %d outputs, want %s and %s among the inputs and an output", names, len(outs), inputIDs, attentionMask)
	}
	if _, _, err := ReadSignature(filepath.Join(dir, "missing.onnx")); err == nil {
		t.Fatal("a missing file read without an error")
	}
}

func TestIntOption(t *testing.T) {
	for _, c := range []struct {
		value   string
		want    int
		wantErr bool
	}{
		{"", 7, false}, {"1", 1, false}, {"16", 16, false},
		{"0", 0, true}, {"17", 0, true}, {"x", 0, true}, {"2.5", 0, true},
	} {
		opts := map[string]string{}
		if c.value != "" {
			opts["n"] = c.value
		}
		got, err := IntOption(opts, "n", 7, 1, 16)
		if (err != nil) != c.wantErr || got != c.want {
			t.Errorf("IntOption(n=%q) = %d, %v; want %d, error %v", c.value, got, err, c.want, c.wantErr)
		}
	}
}
