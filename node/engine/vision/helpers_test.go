package vision

import (
	"image"
	"image/png"
	"os"
	"path/filepath"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// skimageData is where Debian's python3-skimage keeps its sample photos.
const skimageData = "/usr/lib/python3/dist-packages/skimage/data"

// photo decodes one of skimage's sample PNGs; a missing file fails the test.
func photo(t testing.TB, name string) image.Image {
	t.Helper()
	f, err := os.Open(filepath.Join(skimageData, name))
	if err != nil {
		t.Fatalf("test photo: %v (install python3-skimage)", err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("decode %s: %v", name, err)
	}
	return img
}

// centerNetSpec is the spec scripts/assets-vision.sh's manifest describes.
func centerNetSpec(t testing.TB) engine.Spec {
	t.Helper()
	return engine.Spec{
		ID:    "onnx/centernet/mobilenetv3-coco",
		Task:  engine.TaskObjectDetection,
		Dir:   onnxtest.AssetDir(t, "centernet", "centernet.onnx", "coco-labels.txt"),
		Files: map[string]string{"model": "centernet.onnx", "labels": "coco-labels.txt"},
	}
}

// faceSpec is the spec of the blazeface folder's manifest.
func faceSpec(t testing.TB) engine.Spec {
	t.Helper()
	return engine.Spec{
		ID:    "onnx/blazeface/faceres",
		Task:  engine.TaskFaceDetection,
		Dir:   onnxtest.AssetDir(t, "blazeface", "blazeface-back-256.onnx", "faceres.onnx"),
		Files: map[string]string{"detector": "blazeface-back-256.onnx", "embedder": "faceres.onnx"},
	}
}

func loadDetector(t testing.TB) engine.Detector {
	t.Helper()
	d, err := LoadDetector(onnxtest.Runtime(t), centerNetSpec(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func loadFaces(t testing.TB) engine.FaceAnalyzer {
	t.Helper()
	f, err := LoadFaces(onnxtest.Runtime(t), faceSpec(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}
