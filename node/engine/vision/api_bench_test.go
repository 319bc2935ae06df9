package vision

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"image"
	"image/jpeg"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infermesh/infermesh/node/api"
	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/imagecodec"
)

// The API benchmarks post a 640x480 JPEG to a route of the node's API
// (JSON parsing, base64, JPEG decoding, EXIF, the engine's pre- and
// post-processing, the JSON answer) and compare each request with bare
// ONNX Runtime runs of the same sessions on the tensors the pipeline builds
// from the same decoded pixels, interleaved (see interleaved: ratio is bare
// time over API time; the "pipeline" metrics are the API's).

// benchBackend serves one engine for one task under id "m"; the rest of
// api.Backend is not used by the local vision routes.
type benchBackend struct {
	api.Backend
	task engine.Task
	eng  engine.Engine
}

func (b *benchBackend) DefaultModel(task string) string { return "m" }

func (b *benchBackend) TaskEngine(_ context.Context, task engine.Task, id string) (engine.Engine, string, error) {
	if task == b.task && (id == "" || id == "m") {
		return b.eng, "m", nil
	}
	return nil, "", fmt.Errorf("model %s: %w", id, api.ErrModelNotFound)
}

// timedEngine is the benchmarked engine with a clock around its call, so
// that apiBench can tell the API's own work (JSON, base64, JPEG decoding,
// the answer) from the engine's.
type timedEngine struct {
	engine.Engine
	in time.Duration // time inside the last call
}

func (t *timedEngine) Detect(ctx context.Context, req engine.DetectRequest) ([]engine.Detection, error) {
	t0 := time.Now()
	defer func() { t.in = time.Since(t0) }()
	return t.Engine.(engine.Detector).Detect(ctx, req)
}

func (t *timedEngine) Faces(ctx context.Context, req engine.FaceRequest) ([]engine.Face, error) {
	t0 := time.Now()
	defer func() { t.in = time.Since(t0) }()
	return t.Engine.(engine.FaceAnalyzer).Faces(ctx, req)
}

// TakesStreamedImages passes the engine's answer on, so that the API
// streams JPEGs to the engines that take them, as it does unwrapped.
func (t *timedEngine) TakesStreamedImages() bool {
	sc, ok := t.Engine.(interface{ TakesStreamedImages() bool })
	return ok && sc.TakesStreamedImages()
}

func (t *timedEngine) EmbeddingDim() int { return t.Engine.(engine.FaceAnalyzer).EmbeddingDim() }

func (t *timedEngine) Describe(ctx context.Context, req engine.DescribeRequest) (string, error) {
	t0 := time.Now()
	defer func() { t.in = time.Since(t0) }()
	return t.Engine.(engine.Describer).Describe(ctx, req)
}

// jpeg640 encodes img as a quality-90 JPEG and returns the request's data
// URL and the pixels the API decodes from it.
func jpeg640(b *testing.B, img image.Image) (string, image.Image) {
	b.Helper()
	var buf bytes.Buffer
	if err := jpeg.Encode(&buf, img, &jpeg.Options{Quality: 90}); err != nil {
		b.Fatal(err)
	}
	url := "data:image/jpeg;base64," + base64.StdEncoding.EncodeToString(buf.Bytes())
	dec, _, err := imagecodec.DecodeBudgeted(context.Background(), url, imagecodec.Options{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	return url, dec
}

// apiBench runs the interleaved comparison: body posted to route on an
// API server over eng, against bare (which returns the time of its runs
// alone). It also reports api-ms, the median time of a request spent
// outside the engine's call (reading and parsing the JSON body, base64 and
// JPEG decoding, the budget, writing the answer), and api-ms-min, the
// fastest.
func apiBench(b *testing.B, task engine.Task, eng engine.Engine, route, body string, bare func() time.Duration) {
	b.Helper()
	te := &timedEngine{Engine: eng}
	h := api.New(api.Options{Backend: &benchBackend{task: task, eng: te}, Logger: slog.New(slog.DiscardHandler),
		Registry: prometheus.NewRegistry()}).LocalHandler()
	var outside []time.Duration
	post := func() time.Duration {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, route, strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		t0 := time.Now()
		h.ServeHTTP(w, r)
		d := time.Since(t0)
		if w.Code != http.StatusOK {
			b.Fatalf("%s: %d %.300s", route, w.Code, w.Body)
		}
		outside = append(outside, d-te.in)
		return d
	}
	interleaved(b, post, bare)
	slices.Sort(outside)
	b.ReportMetric(outside[len(outside)/2].Seconds()*1e3, "api-ms")
	b.ReportMetric(outside[0].Seconds()*1e3, "api-ms-min")
}

// bareSlot times one run of m on a copy of in (the copy is not timed).
func bareSlot(b *testing.B, m *model, in []float32) time.Duration {
	ctx := context.Background()
	s, err := m.acquire(ctx, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer m.release(s)
	copy(s.in[0], in)
	t0 := time.Now()
	if err := m.run(ctx, s, 1); err != nil {
		b.Fatal(err)
	}
	return time.Since(t0)
}

// BenchmarkAPIDetections640: POST /v1/vision/detections with CenterNet on
// the motorcycle photo's top-left 640x480.
func BenchmarkAPIDetections640(b *testing.B) {
	d := loadDetector(b).(*detector)
	url, img := jpeg640(b, bench640(b, false))
	in := make([]float32, d.size*d.size*3)
	resampleWindow(toRGBA(img), 0, 0, 640, 480, d.size, d.size, in, 1, 0)
	apiBench(b, engine.TaskObjectDetection, d, "/v1/vision/detections", `{"image":"`+url+`"}`,
		func() time.Duration { return bareSlot(b, d.m, in) })
}

// BenchmarkAPIFaces640: POST /v1/vision/faces with embeddings (BlazeFace
// and FaceRes) on the astronaut on a grey 640x480 canvas (one face).
func BenchmarkAPIFaces640(b *testing.B) {
	f := loadFaces(b).(*faces)
	url, img := jpeg640(b, bench640(b, true))
	got, err := f.Faces(context.Background(), engine.FaceRequest{Image: img, Embeddings: true})
	if err != nil || len(got) != 1 {
		b.Fatalf("bench photo: %d faces, %v", len(got), err)
	}
	src := toRGBA(img)
	det := make([]float32, f.size*f.size*3)
	resampleWindow(src, 0, -80, 640, 640, f.size, f.size, det, 1/127.5, -1)
	crop := make([]float32, faceResSize*faceResSize*3)
	rotatedCrop(src, 320, 240, 200, 0, faceResSize, crop, 1, 0)
	apiBench(b, engine.TaskFaceDetection, f, "/v1/vision/faces", `{"image":"`+url+`","return_embeddings":true}`,
		func() time.Duration { return bareSlot(b, f.det, det) + bareSlot(b, f.emb, crop) })
}

// BenchmarkAPIDescribe640: POST /v1/images/describe (detail "more") with
// the composed describer on the astronaut picture, against bare sequential
// runs of CenterNet, BlazeFace and the OCR detector (the pipeline runs its
// components concurrently, so it may beat the sequential sum).
func BenchmarkAPIDescribe640(b *testing.B) {
	d := loadDescriber(b).(*composed)
	url, img := jpeg640(b, bench640(b, true))
	det, fc, o := d.det.(*detector), d.faces.(*faces), d.ocr.(*ocr)
	src := toRGBA(img)
	cn := make([]float32, det.size*det.size*3)
	resampleWindow(src, 0, 0, 640, 480, det.size, det.size, cn, 1, 0)
	bf := make([]float32, fc.size*fc.size*3)
	resampleWindow(src, 0, -80, 640, 640, fc.size, fc.size, bf, 1/127.5, -1)
	ocrDet, dw, dh, _, _ := ocrTensorsNoRec(o, src)
	apiBench(b, engine.TaskImageDescription, d, "/v1/images/describe", `{"detail":"more","image":"`+url+`"}`,
		func() time.Duration {
			return bareSlot(b, det.m, cn) + bareSlot(b, fc.det, bf) + bareDyn(b, o.det, o.done, ocrDet, 1, 3, int64(dh), int64(dw))
		})
}
