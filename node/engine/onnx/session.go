package onnx

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	ort "github.com/yalue/onnxruntime_go"
)

// RunCancellable calls run, which runs a session with opts, and terminates
// that run when ctx is cancelled: a context.AfterFunc callback sets opts'
// terminate flag, which ONNX Runtime checks between graph nodes. Before
// returning, RunCancellable waits for a callback that has started (so the
// caller may reuse or destroy opts at once) and, if it ran, clears the flag
// with UnsetTerminate so that opts can serve the next run. It returns run's
// error, or else the error of UnsetTerminate; it does not wrap either, nor
// does it replace a run error with ctx.Err() — that is the caller's choice.
func RunCancellable(ctx context.Context, opts *ort.RunOptions, run func() error) error {
	terminated := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(terminated)
		_ = opts.Terminate()
	})
	err := run()
	if !stop() {
		// The terminate callback started: wait for it, then make the run
		// options usable again.
		<-terminated
		if uerr := opts.UnsetTerminate(); uerr != nil && err == nil {
			err = uerr
		}
	}
	return err
}

// ReadSignature reads the inputs and outputs of the model file at path
// through a probe session that skips graph optimisation, so it costs little
// next to the real session. Errors are returned as they come, for the
// caller to wrap.
func ReadSignature(path string) (ins, outs []ort.InputOutputInfo, err error) {
	probe, err := ort.NewSessionOptions()
	if err != nil {
		return nil, nil, err
	}
	defer probe.Destroy()
	if err := probe.SetGraphOptimizationLevel(ort.GraphOptimizationLevelDisableAll); err != nil {
		return nil, nil, err
	}
	return ort.GetInputOutputInfoWithOptions(path, probe)
}

// IntOption parses options[key] (a model spec's option) as an integer in
// [lo, hi]; a missing or empty value gives def. The error names the option
// and the range.
func IntOption(options map[string]string, key string, def, lo, hi int) (int, error) {
	s, ok := options[key]
	if !ok || s == "" {
		return def, nil
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < lo || v > hi {
		return 0, fmt.Errorf("option %s=%q: want an integer in [%d, %d]", key, s, lo, hi)
	}
	return v, nil
}

// ResidentBytes returns the process's resident set size from
// /proc/self/statm (Linux). ONNX Runtime does not report what its arenas
// hold, so the memory a model holds is estimated from this figure taken
// before and after its load (and its first run).
func ResidentBytes() (int64, error) {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0, fmt.Errorf("onnx: /proc/self/statm: %q", b)
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("onnx: /proc/self/statm: %w", err)
	}
	return pages * int64(os.Getpagesize()), nil
}
