package vision

import (
	"context"
	"encoding/json"
	"image"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// converterReference is testdata/converter_reference.json: outputs of the
// original TF.js graph models computed by TF.js itself (see
// testdata/gen_reference.py for the command that produced it).
type converterReference struct {
	CenterNet struct {
		TopIndex        []int        `json:"top_index"`
		TopScore        []float32    `json:"top_score"`
		TopWH           [][4]float32 `json:"top_wh"`
		ScoreChannelSum []float64    `json:"score_channel_sum"`
		WHChannelSum    []float64    `json:"wh_channel_sum"`
	} `json:"centernet"`
	FaceRes struct {
		X, Y      int
		Embedding []float32 `json:"embedding"`
	} `json:"faceres"`
}

// Tolerances of the converted models against TF.js, both in float32 on the
// CPU with different kernels and summation orders. Measured differences
// (this machine, ORT 1.30): heat-map scores 5e-7 (values up to 0.64), box
// sides 9e-5 px (values up to about 500 px), FaceRes features 2e-6 (values
// up to 1.4). The bounds leave about an order of magnitude of headroom. A
// wrong mapping is far outside them: converting with SAME_LOWER instead of
// SAME_UPPER padding moved scores by 0.58 and sides by 64 px, and the
// half_pixel instead of the asymmetric resize mode by 0.52 and 19 px.
const (
	tolScore   = 1e-5 // heat-map score, absolute
	tolSide    = 1e-3 // box side, input pixels, absolute
	tolChanSum = 1e-4 // per-channel sum over the 128x128 map, relative
	tolEmbed   = 1e-4 // FaceRes feature, absolute
	refTopK    = 200  // entries in the reference's top list
)

func readReference(t *testing.T) converterReference {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "converter_reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref converterReference
	if err := json.Unmarshal(data, &ref); err != nil {
		t.Fatal(err)
	}
	if len(ref.CenterNet.TopIndex) != refTopK || len(ref.FaceRes.Embedding) != faceResDim {
		t.Fatalf("reference file: %d top entries, %d features", len(ref.CenterNet.TopIndex), len(ref.FaceRes.Embedding))
	}
	return ref
}

// pixelsNHWC writes the w x h window of img at (x, y) as RGB 0..255 floats,
// with no resampling: the same numbers gen_reference.py gives TF.js.
func pixelsNHWC(img image.Image, x, y, w, h int, dst []float32) {
	rgba := toRGBA(img)
	for j := range h {
		for i := range w {
			p := rgba.Pix[(y+j)*rgba.Stride+4*(x+i):]
			o := dst[(j*w+i)*3:]
			o[0], o[1], o[2] = float32(p[0]), float32(p[1]), float32(p[2])
		}
	}
}

// TestConvertedCenterNetMatchesTFJS runs the ONNX file scripts/tfjs2onnx.py
// made on astronaut.png and compares it with TF.js's own run of the
// original graph.
func TestConvertedCenterNetMatchesTFJS(t *testing.T) {
	ref := readReference(t)
	dir := onnxtest.AssetDir(t, "centernet", "centernet.onnx")
	m, err := openModel(onnxtest.Runtime(t), "centernet", filepath.Join(dir, "centernet.onnx"),
		[]tensorSpec{{centerNetInput, []int64{1, 512, 512, 3}}},
		[]tensorSpec{{centerNetHeat, []int64{1, 128, 128, 80}}, {centerNetSides, []int64{1, 128, 128, 4}}}, 1, 1, false)
	if err != nil {
		t.Fatal(err)
	}
	defer m.close()
	s, _ := m.acquire(context.Background(), nil)
	defer m.release(s)
	pixelsNHWC(photo(t, "astronaut.png"), 0, 0, 512, 512, s.in[0])
	if err := m.run(context.Background(), s, 1); err != nil {
		t.Fatal(err)
	}
	heat, sides := s.out[0], s.out[1]
	var maxScore, maxSide float64
	for k, idx := range ref.CenterNet.TopIndex {
		maxScore = math.Max(maxScore, math.Abs(float64(heat[idx]-ref.CenterNet.TopScore[k])))
		for c := range 4 {
			maxSide = math.Max(maxSide, math.Abs(float64(sides[idx/80*4+c]-ref.CenterNet.TopWH[k][c])))
		}
	}
	t.Logf("top %d cells: max |onnx-tfjs| score %.2g, box side %.2g px", len(ref.CenterNet.TopIndex), maxScore, maxSide)
	if maxScore > tolScore || maxSide > tolSide {
		t.Errorf("converted CenterNet differs from TF.js: score %.3g (tol %g), side %.3g px (tol %g)", maxScore, tolScore, maxSide, tolSide)
	}
	checkSums := func(name string, v []float32, want []float64) {
		got := make([]float64, len(want))
		for i, x := range v {
			got[i%len(want)] += float64(x)
		}
		for c := range want {
			if rel := math.Abs(got[c]-want[c]) / math.Max(math.Abs(want[c]), 1); rel > tolChanSum {
				t.Errorf("%s channel %d sum %g, TF.js %g (rel %.2g > %g)", name, c, got[c], want[c], rel, tolChanSum)
			}
		}
	}
	checkSums("score", heat, ref.CenterNet.ScoreChannelSum)
	checkSums("wh", sides, ref.CenterNet.WHChannelSum)
}

// TestConvertedFaceResMatchesTFJS compares the converted FaceRes descriptor
// of a fixed astronaut.png window with TF.js's.
func TestConvertedFaceResMatchesTFJS(t *testing.T) {
	ref := readReference(t)
	dir := onnxtest.AssetDir(t, "blazeface", "faceres.onnx")
	m, err := openModel(onnxtest.Runtime(t), "faceres", filepath.Join(dir, "faceres.onnx"),
		[]tensorSpec{{faceResInput, []int64{1, 224, 224, 3}}},
		[]tensorSpec{{faceResEmbed, []int64{1, faceResDim}}}, 1, 1, false)
	if err != nil {
		t.Fatal(err)
	}
	defer m.close()
	s, _ := m.acquire(context.Background(), nil)
	defer m.release(s)
	pixelsNHWC(photo(t, "astronaut.png"), ref.FaceRes.X, ref.FaceRes.Y, 224, 224, s.in[0])
	if err := m.run(context.Background(), s, 1); err != nil {
		t.Fatal(err)
	}
	var maxDiff, maxAbs float64
	for i, want := range ref.FaceRes.Embedding {
		maxDiff = math.Max(maxDiff, math.Abs(float64(s.out[0][i]-want)))
		maxAbs = math.Max(maxAbs, math.Abs(float64(want)))
	}
	t.Logf("FaceRes: max |onnx-tfjs| %.2g (largest feature %.2f)", maxDiff, maxAbs)
	if maxDiff > tolEmbed {
		t.Errorf("converted FaceRes differs from TF.js by %.3g (tol %g)", maxDiff, tolEmbed)
	}
}
