package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/png"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// These tests drive the real infermesh binary with the official OpenAI Go
// SDK. The binary is built once per test run.
var binPath string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "infermesh-e2e-")
	if err != nil {
		panic(err)
	}
	binPath = filepath.Join(dir, "infermesh")
	out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build infermesh: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is one running infermesh process.
type proc struct {
	id     string
	cmd    *exec.Cmd
	addr   string
	stderr *bytes.Buffer
	// exited is closed when the process has exited; err is its Wait error.
	exited chan struct{}
	err    error
}

var listenLine = regexp.MustCompile(`msg="node listening".* addr=(\S+)`)

// startNode imports the named cached models into a fresh data dir and
// starts `infermesh serve` on a free loopback port.
func startNode(t *testing.T, id string, models ...string) *proc {
	t.Helper()
	return startNodeArgs(t, id, models, "--listen", "127.0.0.1:0", "--gossip-listen", "127.0.0.1:0", "--rpc-listen", "127.0.0.1:0", "--drain-timeout", "60s")
}

// startNodeArgs is startNode with the serve flags given.
func startNodeArgs(t *testing.T, id string, models []string, args ...string) *proc {
	t.Helper()
	data := t.TempDir()
	for _, m := range models {
		out, err := exec.Command(binPath, "models", "import", "--data-dir", data, onnxtest.AssetDir(t, m, "manifest.json")).CombinedOutput()
		if err != nil {
			t.Fatalf("import %s: %v\n%s", m, err, out)
		}
	}
	return launch(t, id, append([]string{"serve", "--data-dir", data, "--node-id", id}, args...))
}

// restartProc starts a stopped node again with its command line and data
// directory.
func restartProc(t *testing.T, p *proc) *proc {
	t.Helper()
	return launch(t, p.id, p.cmd.Args[1:])
}

// launch runs the binary with args and waits until it listens.
func launch(t *testing.T, id string, args []string) *proc {
	t.Helper()
	cmd := exec.Command(binPath, args...)
	pr, pw := io.Pipe()
	cmd.Stderr = pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{id: id, cmd: cmd, stderr: &bytes.Buffer{}, exited: make(chan struct{})}
	addrCh := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			p.stderr.WriteString(line + "\n")
			if m := listenLine.FindStringSubmatch(line); m != nil {
				addrCh <- m[1]
			}
		}
	}()
	go func() { p.err = cmd.Wait(); pw.Close(); close(p.exited) }()
	select {
	case p.addr = <-addrCh:
	case <-p.exited:
		t.Fatalf("node exited before listening: %v\n%s", p.err, p.stderr)
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("node did not start listening\n%s", p.stderr)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			t.Logf("node %s log:\n%s", id, p.stderr)
		}
	})
	return p
}

func (p *proc) client() openai.Client {
	return openai.NewClient(option.WithBaseURL("http://"+p.addr+"/v1/"), option.WithAPIKey("unused-on-loopback"), option.WithMaxRetries(0))
}

func (p *proc) url(path string) string { return "http://" + p.addr + path }

func norm(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x * x
	}
	return math.Sqrt(s)
}

func TestEndToEndModelsAndEmbeddings(t *testing.T) {
	p := startNode(t, "e2e-embed", "tiny-bert", "isnet")
	c := p.client()
	ctx := context.Background()

	page, err := c.Models.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, m := range page.Data {
		ids[m.ID] = true
		if m.Object != "model" || m.Created == 0 || m.OwnedBy != "onnx" {
			t.Errorf("model item %+v", m)
		}
	}
	const bert, bertWire = "onnx/tiny-bert/test-128", "tiny-bert:test-128"
	if !ids[bert] || !ids["onnx/isnet/general-use-small"] || len(ids) != 2 {
		t.Fatalf("models listed: %v", ids)
	}
	for _, id := range []string{bert, bertWire} {
		m, err := c.Models.Get(ctx, id)
		if err != nil {
			t.Fatalf("get %s: %v", id, err)
		}
		if m.ID != bert {
			t.Errorf("get %s returned %s", id, m.ID)
		}
	}

	one, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{
		Model: bertWire,
		Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("the quick brown fox")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(one.Data) != 1 || len(one.Data[0].Embedding) != 128 || one.Usage.PromptTokens < 4 || one.Model != bert {
		t.Fatalf("single embedding: %d vectors, dim %d, usage %+v, model %s", len(one.Data), len(one.Data[0].Embedding), one.Usage, one.Model)
	}
	texts := []string{"the quick brown fox", "jumps over the lazy dog", "the quick brown fox", "an entirely different sentence about rivers"}
	for _, format := range []openai.EmbeddingNewParamsEncodingFormat{openai.EmbeddingNewParamsEncodingFormatFloat, openai.EmbeddingNewParamsEncodingFormatBase64} {
		batch, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{
			Model:          bert,
			Input:          openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: texts},
			EncodingFormat: format,
		})
		if err != nil {
			t.Fatalf("%s: %v", format, err)
		}
		if len(batch.Data) != len(texts) {
			t.Fatalf("%s: %d vectors for %d inputs", format, len(batch.Data), len(texts))
		}
		v := make([][]float64, len(texts))
		for i, d := range batch.Data {
			if int(d.Index) != i {
				t.Fatalf("%s: index %d at %d", format, d.Index, i)
			}
			v[i] = d.Embedding
			if n := norm(v[i]); math.Abs(n-1) > 1e-4 {
				t.Errorf("%s: vector %d has norm %f", format, i, n)
			}
		}
		if dist(v[0], v[2]) > 1e-5 {
			t.Errorf("%s: identical inputs differ by %g", format, dist(v[0], v[2]))
		}
		if dist(v[0], v[1]) < 1e-3 || dist(v[1], v[3]) < 1e-3 {
			t.Errorf("%s: different inputs gave (nearly) identical vectors", format)
		}
		if dist(v[0], one.Data[0].Embedding) > 1e-5 {
			t.Errorf("%s: batch vector differs from the single request's", format)
		}
	}

	// A background batch job gives the same vectors as the direct call.
	checkBatchJob(t, p, texts, one.Data[0].Embedding)

	// Errors through the SDK carry the status and the code.
	_, err = c.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "onnx/nope/missing", Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("x")}})
	expectAPIError(t, err, 404, "model_not_found", "model")
	_, err = c.Models.Get(ctx, "nope:latest")
	expectAPIError(t, err, 404, "model_not_found", "model")
	_, err = c.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: bert, Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{}}})
	expectAPIError(t, err, 400, "invalid_value", "input")
	_, err = c.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: bert, Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("x")}},
		option.WithJSONSet("dimensions", "many"))
	expectAPIError(t, err, 400, "invalid_type", "dimensions")
}

func dist(a, b []float64) float64 {
	var s float64
	for i := range a {
		d := a[i] - b[i]
		s += d * d
	}
	return math.Sqrt(s)
}

func expectAPIError(t *testing.T, err error, status int, code, param string) {
	t.Helper()
	var apierr *openai.Error
	if !errors.As(err, &apierr) {
		t.Fatalf("want an API error %d %s, got %v", status, code, err)
	}
	if apierr.StatusCode != status || apierr.Code != code || apierr.Param != param {
		t.Fatalf("got %d code=%q param=%q (%s); want %d code=%q param=%q", apierr.StatusCode, apierr.Code, apierr.Param, apierr.Message, status, code, param)
	}
}

// errorBody decodes an OpenAI error body.
func errorBody(t *testing.T, resp *http.Response) (code, param string) {
	t.Helper()
	var body struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Code    *string `json:"code"`
			Param   *string `json:"param"`
		} `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("%s: error body is not JSON: %v", resp.Request.URL, err)
	}
	if body.Error.Message == "" || body.Error.Type == "" {
		t.Fatalf("%s: error body lacks message or type: %+v", resp.Request.URL, body)
	}
	if body.Error.Code != nil {
		code = *body.Error.Code
	}
	if body.Error.Param != nil {
		param = *body.Error.Param
	}
	return code, param
}

func checkHeaders(t *testing.T, resp *http.Response, wantID string) {
	t.Helper()
	id := resp.Header.Get("X-Request-Id")
	if id == "" || (wantID != "" && id != wantID) {
		t.Errorf("%s %s: X-Request-Id %q, want %q", resp.Request.Method, resp.Request.URL.Path, id, wantID)
	}
	if resp.Header.Get("X-Service-Version") == "" {
		t.Errorf("%s: no X-Service-Version", resp.Request.URL.Path)
	}
	if _, err := fmt.Sscan(resp.Header.Get("openai-processing-ms"), new(int)); err != nil {
		t.Errorf("%s: openai-processing-ms %q", resp.Request.URL.Path, resp.Header.Get("openai-processing-ms"))
	}
}

func TestEndToEndPathsHeadersAndBadInput(t *testing.T) {
	p := startNode(t, "e2e-http", "tiny-bert")
	type row struct {
		method, path, body string
		status             int
		code, param        string
	}
	rows := []row{
		{"GET", "/v1/nothing-here", "", 404, "unknown_url", ""},
		{"POST", "/v1/responses", `{}`, 404, "unknown_url", ""},
		{"POST", "/v1/completions", `{}`, 404, "unknown_url", ""},
		{"POST", "/v1/moderations", `{}`, 404, "unknown_url", ""},
		{"GET", "/v1/files", "", 404, "unknown_url", ""},
		{"POST", "/v1/fine_tuning/jobs", `{}`, 404, "unknown_url", ""},
		{"POST", "/v1/assistants", `{}`, 404, "unknown_url", ""},
		{"DELETE", "/v1/embeddings", "", 405, "method_not_allowed", ""},
		{"POST", "/v1/embeddings", `{"model":`, 400, "invalid_json", ""},
		{"POST", "/v1/embeddings", `[1,2]`, 400, "invalid_json", ""},
		{"POST", "/v1/embeddings", `{"model":5,"input":"x"}`, 400, "invalid_type", "model"},
		{"POST", "/v1/embeddings", `{"model":"tiny-bert:test-128"}`, 400, "missing_required_parameter", "input"},
		{"POST", "/v1/embeddings", `{"model":"tiny-bert:test-128","input":[1,"a"]}`, 400, "invalid_type", "input"},
		{"POST", "/v1/embeddings", `{"model":"tiny-bert:test-128","input":"x","bogus":1}`, 400, "unknown_parameter", "bogus"},
		{"POST", "/v1/embeddings", `{"model":"tiny-bert:test-128","input":"x","encoding_format":"int8"}`, 400, "invalid_value", "encoding_format"},
		{"POST", "/v1/embeddings", `{"model":"tiny-bert:test-128","input":"x","dimensions":4096}`, 400, "invalid_value", "dimensions"},
		{"POST", "/v1/embeddings", `{"model":"tiny-bert:test-128","input":["` + strings.Repeat(`a","`, 2100) + `a"]}`, 400, "invalid_value", "input"},
		{"POST", "/v1/embeddings", `{"model":"tiny-bert:test-128","input":"` + strings.Repeat("a", 5<<20) + `"}`, 413, "request_too_large", ""},
		{"POST", "/v1/vision/background", `{"image":"aGVsbG8="}`, 501, "no_provider_configured", "model"},
		{"POST", "/v1/vision/detections", `{"model":"x","image":"aGVsbG8="}`, 501, "no_provider_configured", "model"},
		{"POST", "/v1/vision/faces", `{"model":"x","image":"aGVsbG8="}`, 501, "no_provider_configured", "model"},
		{"POST", "/v1/chat/completions", `{"model":"llama:8b","messages":[{"role":"user","content":"hi"}]}`, 404, "model_not_found", "model"},
		{"POST", "/v1/chat/completions", `{"model":"tiny-bert:test-128","messages":[{"role":"user","content":"hi"}]}`, 400, "model_not_supported", "model"},
		{"POST", "/v1/chat/completions", `{"model":"tiny-bert:test-128","messages":[]}`, 400, "missing_required_parameter", "messages"},
		{"POST", "/v1/images/generations", `{"model":"sd:1","prompt":"x"}`, 404, "model_not_found", "model"},
		{"POST", "/v1/audio/speech", `{"input":"x"}`, 400, "missing_required_parameter", "model"},
		{"GET", "/v1/audio/transcriptions/stream?model=whisper:tiny", "", 404, "model_not_found", "model"},
	}
	for _, r := range rows {
		req, _ := http.NewRequest(r.method, p.url(r.path), strings.NewReader(r.body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Request-Id", "caller-id.1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", r.method, r.path, err)
		}
		if resp.StatusCode != r.status {
			b, _ := io.ReadAll(resp.Body)
			t.Errorf("%s %.60s: status %d, want %d: %s", r.method, r.path, resp.StatusCode, r.status, b)
			resp.Body.Close()
			continue
		}
		checkHeaders(t, resp, "caller-id.1")
		code, param := errorBody(t, resp)
		resp.Body.Close()
		if code != r.code || param != r.param {
			t.Errorf("%s %.60s: code %q param %q, want %q %q", r.method, r.path, code, param, r.code, r.param)
		}
	}
	// A malformed caller request id is replaced, success responses carry
	// the headers too (/readyz says ready once the raft replica caught up,
	// about 2 s after start).
	var resp *http.Response
	eventually(t, 10*time.Second, "readyz 200", func() error {
		req, _ := http.NewRequest("GET", p.url("/readyz"), nil)
		req.Header.Set("X-Request-Id", "bad id with spaces")
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		r.Body.Close()
		if r.StatusCode != 200 {
			return fmt.Errorf("readyz %d", r.StatusCode)
		}
		resp = r
		return nil
	})
	checkHeaders(t, resp, "")
	if got := resp.Header.Get("X-Request-Id"); got == "bad id with spaces" {
		t.Errorf("malformed request id was echoed")
	}
	// The node still serves after all of that.
	c := p.client()
	if _, err := c.Embeddings.New(context.Background(), openai.EmbeddingNewParams{Model: "tiny-bert:test-128", Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("still alive")}}); err != nil {
		t.Fatal(err)
	}
}

func removeBackground(t *testing.T, p *proc, photo []byte) (*http.Response, error) {
	body, _ := json.Marshal(map[string]string{"model": "isnet:small", "image": "data:image/png;base64," + base64.StdEncoding.EncodeToString(photo)})
	return http.Post(p.url("/v1/vision/background"), "application/json", bytes.NewReader(body))
}

func decodeBackground(t *testing.T, resp *http.Response) image.Image {
	t.Helper()
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("background: %d %s", resp.StatusCode, b)
	}
	var out struct {
		Image     string `json:"image"`
		MediaType string `json:"media_type"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	b64, ok := strings.CutPrefix(out.Image, "data:image/png;base64,")
	if !ok || out.MediaType != "image/png" {
		t.Fatalf("background: media type %q, image prefix %.40q", out.MediaType, out.Image)
	}
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// meanAlpha is the mean alpha (0..1) over a rectangle.
func meanAlpha(img image.Image, r image.Rectangle) float64 {
	var sum float64
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			_, _, _, a := img.At(x, y).RGBA()
			sum += float64(a) / 0xffff
		}
	}
	return sum / float64(r.Dx()*r.Dy())
}

func TestEndToEndBackgroundRemovalAndDrain(t *testing.T) {
	p := startNode(t, "e2e-vision", "isnet")
	photo := onnxtest.GoTestdata(t, "video-001.png")
	backgroundRegions, foregroundRegions := onnxtest.PhotoRegions()
	src, err := png.Decode(bytes.NewReader(photo))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := removeBackground(t, p, photo)
	if err != nil {
		t.Fatal(err)
	}
	checkHeaders(t, resp, "")
	img := decodeBackground(t, resp)
	if img.Bounds() != src.Bounds() {
		t.Fatalf("output %v, input %v", img.Bounds(), src.Bounds())
	}
	for _, r := range backgroundRegions {
		if a := meanAlpha(img, r); a > 0.2 {
			t.Errorf("background region %v has mean alpha %.2f", r, a)
		}
	}
	for _, r := range foregroundRegions {
		if a := meanAlpha(img, r); a < 0.8 {
			t.Errorf("foreground region %v has mean alpha %.2f", r, a)
		}
	}

	// SIGTERM while a request is running: the request finishes, /readyz says
	// 503 meanwhile, new work is refused with 503, then the process exits 0.
	type result struct {
		resp *http.Response
		err  error
	}
	slow := make(chan result, 1)
	big, bigBounds := bigPhoto(t, src)
	go func() {
		r, err := removeBackground(t, p, big)
		slow <- result{r, err}
	}()
	waitInFlight(t, p)
	// In flight counts from the request's head; wait until it is past
	// routing and running (it holds a busy-gate slot), so it is work the
	// drain must finish, not new work it refuses.
	eventually(t, 30*time.Second, "background removal running", func() error {
		if n, err := metricSum(p, "infermesh_gate_inflight"); err != nil || n < 1 {
			return fmt.Errorf("gate in flight %v (%v)", n, err)
		}
		return nil
	})
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	sawDraining := false
	for i := 0; i < 200 && !sawDraining; i++ {
		r, err := http.Get(p.url("/readyz"))
		if err != nil {
			break
		}
		r.Body.Close()
		sawDraining = r.StatusCode == 503
		if !sawDraining {
			time.Sleep(5 * time.Millisecond)
		}
	}
	if !sawDraining {
		t.Error("/readyz never answered 503 while draining")
	}
	res := <-slow
	if res.err != nil {
		t.Fatalf("in-flight request failed during drain: %v", res.err)
	}
	if out := decodeBackground(t, res.resp); out.Bounds() != bigBounds {
		t.Fatalf("drained request returned %v", out.Bounds())
	}
	select {
	case <-p.exited:
		if p.err != nil {
			t.Fatalf("node exit after drain: %v\n%s", p.err, p.stderr)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("node did not exit after drain")
	}
}

// bigPhoto tiles the photo into a 3x3 mosaic so that one request keeps the
// node busy long enough to signal it mid-request.
func bigPhoto(t *testing.T, src image.Image) ([]byte, image.Rectangle) {
	b := src.Bounds()
	big := image.NewNRGBA(image.Rect(0, 0, 3*b.Dx(), 3*b.Dy()))
	for ty := 0; ty < 3; ty++ {
		for tx := 0; tx < 3; tx++ {
			for y := 0; y < b.Dy(); y++ {
				for x := 0; x < b.Dx(); x++ {
					big.Set(tx*b.Dx()+x, ty*b.Dy()+y, src.At(b.Min.X+x, b.Min.Y+y))
				}
			}
		}
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, big); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), big.Bounds()
}

// waitInFlight polls the dashboard data until a request other than the
// poll itself is being served.
func waitInFlight(t *testing.T, p *proc) {
	t.Helper()
	for i := 0; i < 2000; i++ {
		r, err := http.Get(p.url("/dashboard/data"))
		if err != nil {
			t.Fatal(err)
		}
		var d struct {
			InFlight int `json:"inflight"`
		}
		json.NewDecoder(r.Body).Decode(&d)
		r.Body.Close()
		if d.InFlight >= 2 {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatal("the slow request never showed up in flight")
}

func checkBatchJob(t *testing.T, p *proc, texts []string, first []float64) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "tiny-bert:test-128", "input": texts})
	resp, err := http.Post(p.url("/v1/batch/embeddings"), "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var job struct {
		ID     string `json:"id"`
		Status string `json:"status"`
		Counts struct {
			Total, Completed int
		} `json:"request_counts"`
		Data []struct {
			Index     int       `json:"index"`
			Embedding []float64 `json:"embedding"`
		} `json:"data"`
	}
	json.NewDecoder(resp.Body).Decode(&job)
	resp.Body.Close()
	if resp.StatusCode != 200 || job.ID == "" || job.Counts.Total != len(texts) {
		t.Fatalf("batch submit: %d %+v", resp.StatusCode, job)
	}
	for i := 0; i < 500 && job.Status != "completed"; i++ {
		if job.Status == "failed" || job.Status == "cancelled" {
			t.Fatalf("batch job ended %s", job.Status)
		}
		time.Sleep(10 * time.Millisecond)
		r, err := http.Get(p.url("/v1/batch/embeddings/" + job.ID))
		if err != nil {
			t.Fatal(err)
		}
		json.NewDecoder(r.Body).Decode(&job)
		r.Body.Close()
	}
	if job.Status != "completed" || len(job.Data) != len(texts) || job.Counts.Completed != len(texts) {
		t.Fatalf("batch job: %s, %d vectors", job.Status, len(job.Data))
	}
	if dist(job.Data[0].Embedding, first) > 1e-5 {
		t.Errorf("batch job vector differs from the direct request's")
	}
	r, _ := http.Get(p.url("/v1/batch/embeddings/embbatch_nope"))
	if r.StatusCode != 404 {
		t.Errorf("unknown batch job: %d", r.StatusCode)
	}
	r.Body.Close()
}
