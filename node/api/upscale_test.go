package api

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
	"github.com/infermesh/infermesh/node/engine/upscale"
)

// upscaleBackend serves one real upscaler under id "up" and says every
// other id serves another task; the rest of Backend is unused here.
type upscaleBackend struct {
	Backend
	eng engine.Upscaler
}

func (b *upscaleBackend) DefaultModel(task string) string { return "up" }

func (b *upscaleBackend) TaskEngine(_ context.Context, task engine.Task, id string) (engine.Engine, string, error) {
	if id == "up" && task == engine.TaskImageUpscale {
		return b.eng, "up", nil
	}
	return nil, "", fmt.Errorf("model %s serves the chat task: %w", id, ErrWrongTask)
}

// TestImagesUpscale runs operation "upscale" through the image generation
// handler on the real runtime with the engine package's tiny NCHW x2 model.
func TestImagesUpscale(t *testing.T) {
	dir, _ := filepath.Abs("../engine/upscale/testdata")
	eng, err := upscale.LoadUpscaler(onnxtest.Runtime(t), engine.Spec{ID: "up", Task: engine.TaskImageUpscale, Dir: dir,
		Files: map[string]string{"model": "tiny_nchw_x2.onnx"}, Options: map[string]string{"scale": "2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	s := New(Options{Backend: &upscaleBackend{eng: eng}, Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()})
	src := image.NewNRGBA(image.Rect(0, 0, 20, 12))
	for i := range src.Pix {
		src.Pix[i] = 255
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, src); err != nil {
		t.Fatal(err)
	}
	img := base64.StdEncoding.EncodeToString(buf.Bytes())
	post := func(body string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		s.imagesGenerations(w, httptest.NewRequest(http.MethodPost, "/v1/images/generations", bytes.NewBufferString(body)))
		return w
	}
	w := post(`{"model":"up","operation":"upscale","upscale_factor":2,"image":"` + img + `"}`)
	if w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	var res struct {
		Created int64 `json:"created"`
		Data    []struct {
			B64JSON string `json:"b64_json"`
		} `json:"data"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &res); err != nil || len(res.Data) != 1 || res.Created == 0 {
		t.Fatalf("response %s (%v)", w.Body, err)
	}
	raw, err := base64.StdEncoding.DecodeString(res.Data[0].B64JSON)
	if err != nil {
		t.Fatal(err)
	}
	out, err := png.Decode(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	if out.Bounds().Dx() != 40 || out.Bounds().Dy() != 24 {
		t.Fatalf("output %v, want 40x24", out.Bounds())
	}
	for body, param := range map[string]string{
		`{"model":"up","operation":"upscale","upscale_factor":3,"image":"` + img + `"}`:   "upscale_factor",
		`{"model":"up","operation":"upscale","upscale_factor":4,"image":"` + img + `"}`:   "upscale_factor", // the model has x2 only
		`{"model":"up","operation":"upscale","upscale_factor":2}`:                         "image",
		`{"model":"chat","operation":"upscale","upscale_factor":2,"image":"` + img + `"}`: "model",
		`{"model":"up","operation":"upscale","image":"` + img + `","mask":"aGk="}`:        "mask",
	} {
		w := post(body)
		var e struct {
			Error struct {
				Param string `json:"param"`
			} `json:"error"`
		}
		_ = json.Unmarshal(w.Body.Bytes(), &e)
		if w.Code != http.StatusBadRequest || e.Error.Param != param {
			t.Errorf("%.60s...: %d %s, want 400 naming %s", body, w.Code, w.Body, param)
		}
	}
}
