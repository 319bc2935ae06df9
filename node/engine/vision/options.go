package vision

import (
	"fmt"
	"image"
	"math"
	"strconv"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx"
)

// maxConcurrency bounds the "concurrency" option.
const maxConcurrency = 64

// floatOption parses options[key] as a number in [lo, hi], or returns def.
func floatOption(options map[string]string, key string, def, lo, hi float64) (float64, error) {
	s, ok := options[key]
	if !ok || s == "" {
		return def, nil
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || v < lo || v > hi {
		return 0, fmt.Errorf("option %s=%q: want a number in [%g, %g]", key, s, lo, hi)
	}
	return v, nil
}

// detectOptions parses the options every detector takes:
// confidence_threshold in [0.001, 1] (default thr), nms_iou in [0.01, 1]
// (default nms) and concurrency, the number of simultaneous runs, in
// [1, maxConcurrency] (default 1).
func detectOptions(options map[string]string, thr, nms float64) (float32, float32, int, error) {
	t, err := floatOption(options, "confidence_threshold", thr, 0.001, 1)
	if err != nil {
		return 0, 0, 0, err
	}
	n, err := floatOption(options, "nms_iou", nms, 0.01, 1)
	if err != nil {
		return 0, 0, 0, err
	}
	runs, err := onnx.IntOption(options, "concurrency", 1, 1, maxConcurrency)
	if err != nil {
		return 0, 0, 0, err
	}
	return float32(t), float32(n), runs, nil
}

// spinningOption is the model option that lets ONNX Runtime's intra-op
// threads spin while they wait for work ("on", ONNX Runtime's behaviour)
// or makes them sleep ("off").
const spinningOption = "thread_spinning"

// spinning parses the thread_spinning option; def is the engine's default.
// A spinning pool thread keeps polling for work for a while after each
// parallel section. That helps a model with many operators run alone
// (CenterNet on a quiet machine: 25-31 ms spinning, 29-37 ms sleeping).
// Spinning sessions stop spinning when their last Run returns
// (forceSpinningStop); before that, the face engines' two sessions in a
// row lost to it (BlazeFace+FaceRes 29-30 ms spinning against 24-25
// sleeping). With the stop, one request at a time is faster spinning
// (BenchmarkSpinning640 on the 2-core reference machine: 14.6 against
// 16.3 ms, 67-69 against 52-56 requests a second one after the other),
// but concurrent requests are slower: with 2 and 4 callers 52-55 requests
// a second spinning against 56 and 66 sleeping, the spinning threads of
// one request's run taking the cores the other's needs. A node serves
// concurrent requests, so the face engines default to off; the other
// engines (one session a request) to on.
func spinning(options map[string]string, def bool) (bool, error) {
	switch v := options[spinningOption]; v {
	case "":
		return def, nil
	case "off":
		return false, nil
	case "on":
		return true, nil
	default:
		return false, fmt.Errorf("option %s=%q: want on or off", spinningOption, v)
	}
}

// checkTask refuses a spec for another task (an empty task is accepted).
func checkTask(spec engine.Spec, task engine.Task) error {
	if spec.Task != "" && spec.Task != task {
		return fmt.Errorf("vision: %s: task %q is not %q", spec.ID, spec.Task, task)
	}
	return nil
}

// limits validates a request's image, threshold and result cap and applies
// the defaults: threshold 0 means def, maxResults 0 means
// engine.DefaultMaxResults.
func limits(img image.Image, threshold float32, maxResults int, def float32) (float32, int, error) {
	if img == nil || img.Bounds().Empty() {
		return 0, 0, &engine.InputError{Param: "image", Msg: "image has no pixels"}
	}
	if math.IsNaN(float64(threshold)) || threshold < 0 || threshold > 1 {
		return 0, 0, &engine.InputError{Param: "confidence_threshold", Msg: "confidence_threshold must be between 0 and 1"}
	}
	if threshold == 0 {
		threshold = def
	}
	if maxResults == 0 {
		maxResults = engine.DefaultMaxResults
	}
	if maxResults < 1 || maxResults > engine.MaxResultsLimit {
		return 0, 0, &engine.InputError{Param: "max_results", Msg: fmt.Sprintf("max_results must be between 1 and %d", engine.MaxResultsLimit)}
	}
	return threshold, maxResults, nil
}
