package vision

import (
	"context"
	"errors"
	"image"
	"image/color"
	"math"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// astronautFace is the astronaut's face in astronaut.png (hairline to chin,
// cheek to cheek), measured by drawing it over the photo and looking.
var astronautFace = image.Rect(172, 77, 275, 177)

// astronautMarks are where the astronaut's eyes, nose tip and mouth centre
// are (image-left eye first), measured on the photo; BlazeFace's first four
// landmarks must land within markTolerance pixels of them.
var astronautMarks = [4][2]float32{{203, 101}, {248, 103}, {224, 127}, {224, 149}}

const markTolerance = 8

// onlyFace runs Faces with embeddings and fails unless exactly one face
// comes back.
func onlyFace(t *testing.T, f engine.FaceAnalyzer, img image.Image) engine.Face {
	t.Helper()
	faces, err := f.Faces(context.Background(), engine.FaceRequest{Image: img, Embeddings: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(faces) != 1 {
		t.Fatalf("%d faces, want 1: %+v", len(faces), faces)
	}
	return faces[0]
}

func TestFacesAstronaut(t *testing.T) {
	f := loadFaces(t)
	if f.EmbeddingDim() != 1024 {
		t.Errorf("EmbeddingDim %d, want 1024", f.EmbeddingDim())
	}
	img := photo(t, "astronaut.png")
	face := onlyFace(t, f, img)
	checkInside(t, "face", face.Box, 512, 512)
	iou := rectIoU(face.Box, astronautFace)
	t.Logf("face %.3f box %.0f IoU %.2f landmarks %.0f", face.Confidence, face.Box, iou, face.Landmarks)
	if iou < 0.6 {
		t.Errorf("face box %v has IoU %.2f with the face %v, want >= 0.6", face.Box, iou, astronautFace)
	}
	if face.Confidence < DefaultFaceThreshold || face.Confidence > 1 {
		t.Errorf("confidence %v", face.Confidence)
	}
	if len(face.Landmarks) != 6 {
		t.Fatalf("%d landmarks, want 6", len(face.Landmarks))
	}
	for k, want := range astronautMarks {
		got := face.Landmarks[k]
		if d := math.Hypot(float64(got[0]-want[0]), float64(got[1]-want[1])); d > markTolerance {
			t.Errorf("landmark %d at %v, want within %d px of %v", k, got, markTolerance, want)
		}
	}
	if len(face.Embedding) != 1024 {
		t.Fatalf("embedding length %d", len(face.Embedding))
	}
	if n := dot(face.Embedding, face.Embedding); math.Abs(float64(n)-1) > 1e-4 {
		t.Errorf("embedding |e|^2 = %v, want 1", n)
	}
	// Without embeddings: same face, no vector.
	plain, err := f.Faces(context.Background(), engine.FaceRequest{Image: img})
	if err != nil || len(plain) != 1 || plain[0].Embedding != nil || plain[0].Box != face.Box {
		t.Errorf("without embeddings: %+v, %v", plain, err)
	}
}

// TestFaceEmbeddings checks that the descriptor of the astronaut's face
// stays close under a mirror image, a shift and a brightness change, and
// that another person's face (the man in camera.png) is further from it
// than any of those.
func TestFaceEmbeddings(t *testing.T) {
	f := loadFaces(t)
	img := toRGBA(photo(t, "astronaut.png"))
	ref := onlyFace(t, f, img).Embedding
	variants := map[string]image.Image{
		"mirrored": mapPixels(img, img.Rect, func(x, y int) color.RGBA { return img.RGBAAt(511-x, y) }),
		"shifted":  img.SubImage(image.Rect(40, 24, 512, 512)),
		"darker": mapPixels(img, img.Rect, func(x, y int) color.RGBA {
			c := img.RGBAAt(x, y)
			return color.RGBA{uint8(float32(c.R) * 0.7), uint8(float32(c.G) * 0.7), uint8(float32(c.B) * 0.7), 255}
		}),
	}
	minSame := float32(1)
	for name, v := range variants {
		cos := dot(ref, onlyFace(t, f, v).Embedding)
		t.Logf("%s: cosine %.3f", name, cos)
		if cos < 0.85 {
			t.Errorf("%s astronaut: cosine %.3f with the original, want >= 0.85", name, cos)
		}
		minSame = min(minSame, cos)
	}
	other := dot(ref, onlyFace(t, f, photo(t, "camera.png")).Embedding)
	t.Logf("camera.png's man: cosine %.3f", other)
	if other >= minSame {
		t.Errorf("another person scores %.3f, not below the same face's %.3f", other, minSame)
	}
}

func dot(a, b []float32) float32 {
	var s float32
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// mapPixels makes a new RGBA image over r whose pixels are fn(x, y).
func mapPixels(_ image.Image, r image.Rectangle, fn func(x, y int) color.RGBA) *image.RGBA {
	out := image.NewRGBA(r)
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			out.SetRGBA(x, y, fn(x, y))
		}
	}
	return out
}

// TestFacesOptions checks thresholds, caps, a photo without faces and
// caller errors.
func TestFacesOptions(t *testing.T) {
	f := loadFaces(t)
	ctx := context.Background()
	none, err := f.Faces(ctx, engine.FaceRequest{Image: photo(t, "motorcycle_left.png"), Embeddings: true})
	if err != nil || len(none) != 0 {
		t.Errorf("motorcycle: %+v, %v; want no face", none, err)
	}
	img := photo(t, "astronaut.png")
	low, err := f.Faces(ctx, engine.FaceRequest{Image: img, ConfidenceThreshold: 0.1})
	if err != nil {
		t.Fatal(err)
	}
	if len(low) < 2 {
		t.Fatalf("threshold 0.1 gave %d faces, want more than the one real face", len(low))
	}
	capped, err := f.Faces(ctx, engine.FaceRequest{Image: img, ConfidenceThreshold: 0.1, MaxResults: 1, Embeddings: true})
	if err != nil || len(capped) != 1 || capped[0].Box != low[0].Box || len(capped[0].Embedding) != 1024 {
		t.Errorf("max_results 1: %+v, %v; want the best face %+v", capped, err, low[0])
	}
	for _, bad := range []struct {
		req   engine.FaceRequest
		param string
	}{
		{engine.FaceRequest{}, "image"},
		{engine.FaceRequest{Image: img, ConfidenceThreshold: 2}, "confidence_threshold"},
		{engine.FaceRequest{Image: img, MaxResults: 1001}, "max_results"},
		{engine.FaceRequest{Image: img, MaxResults: -5}, "max_results"},
	} {
		_, err := f.Faces(ctx, bad.req)
		var ie *engine.InputError
		if !errors.As(err, &ie) || ie.Param != bad.param {
			t.Errorf("Faces(%+v) = %v, want an InputError for %q", bad.req, err, bad.param)
		}
	}
}

// TestFacesWithoutEmbedder loads the detector alone.
func TestFacesWithoutEmbedder(t *testing.T) {
	spec := faceSpec(t)
	spec.Files = map[string]string{"detector": spec.Files["detector"]}
	f, err := LoadFaces(onnxtest.Runtime(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.EmbeddingDim() != 0 {
		t.Errorf("EmbeddingDim %d, want 0", f.EmbeddingDim())
	}
	img := photo(t, "astronaut.png")
	if faces, err := f.Faces(context.Background(), engine.FaceRequest{Image: img}); err != nil || len(faces) != 1 {
		t.Errorf("detector only: %+v, %v", faces, err)
	}
	_, err = f.Faces(context.Background(), engine.FaceRequest{Image: img, Embeddings: true})
	var ie *engine.InputError
	if !errors.As(err, &ie) {
		t.Errorf("embeddings without an embedder: %v, want an InputError", err)
	}
	if err := f.Close(); err != nil {
		t.Error(err)
	}
	if _, err := f.Faces(context.Background(), engine.FaceRequest{Image: img}); !errors.Is(err, errClosed) {
		t.Errorf("after Close: %v", err)
	}
}

// TestFacesConcurrent runs calls from several goroutines on two slots per
// model; every call must get the same answer as a lone one.
func TestFacesConcurrent(t *testing.T) {
	spec := faceSpec(t)
	spec.Options = map[string]string{"concurrency": "2"}
	f, err := LoadFaces(onnxtest.Runtime(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img := photo(t, "astronaut.png")
	want := onlyFace(t, f, img)
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			got, err := f.Faces(context.Background(), engine.FaceRequest{Image: img, Embeddings: true})
			if err == nil && (len(got) != 1 || got[0].Box != want.Box || dot(got[0].Embedding, want.Embedding) < 0.9999) {
				err = errors.New("concurrent call gave a different answer")
			}
			errs <- err
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
