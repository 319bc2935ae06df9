package vision

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// TestThreadSpinningOption: thread_spinning loads with "on" and "off" and
// gives the same faces; any other value is refused by name.
func TestThreadSpinningOption(t *testing.T) {
	img := photo(t, "astronaut.png")
	var got [][]engine.Face
	for _, v := range []string{"on", "off"} {
		spec := faceSpec(t)
		spec.Options = map[string]string{spinningOption: v}
		f, err := LoadFaces(onnxtest.Runtime(t), spec)
		if err != nil {
			t.Fatalf("%s=%s: %v", spinningOption, v, err)
		}
		faces, err := f.Faces(context.Background(), engine.FaceRequest{Image: img})
		f.Close()
		if err != nil || len(faces) != 1 {
			t.Fatalf("%s=%s: %d faces, %v", spinningOption, v, len(faces), err)
		}
		got = append(got, faces)
	}
	if got[0][0].Box != got[1][0].Box || got[0][0].Confidence != got[1][0].Confidence {
		t.Errorf("faces differ with the spinning setting: %+v vs %+v", got[0][0], got[1][0])
	}
	spec := centerNetSpec(t)
	spec.Options = map[string]string{spinningOption: "yes"}
	if d, err := LoadDetector(onnxtest.Runtime(t), spec); err == nil || !strings.Contains(err.Error(), spinningOption) {
		if d != nil {
			d.Close()
		}
		t.Fatalf("%s=yes: err %v, want one naming the option", spinningOption, err)
	}
}

// BenchmarkSpinning640 loads an engine twice, with thread_spinning on and
// off, and times each one's Detect or Faces call on the 640x480 bench photo
// and bare runs of its sessions on the same tensors (see rotate). It
// reports the median ms of the four.
func BenchmarkSpinning640(b *testing.B) {
	ctx := context.Background()
	load := func(spec engine.Spec, v string) engine.Engine {
		spec.Options = maps.Clone(spec.Options)
		if spec.Options == nil {
			spec.Options = map[string]string{}
		}
		spec.Options[spinningOption] = v
		var e engine.Engine
		var err error
		if spec.Task == engine.TaskFaceDetection {
			e, err = LoadFaces(onnxtest.Runtime(b), spec)
		} else {
			e, err = LoadDetector(onnxtest.Runtime(b), spec)
		}
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { e.Close() })
		return e
	}
	b.Run("faces", func(b *testing.B) {
		img := bench640(b, true)
		src := toRGBA(img)
		var fns []func() time.Duration
		for _, v := range []string{"on", "off"} {
			f := load(faceSpec(b), v).(*faces)
			det := make([]float32, f.size*f.size*3)
			resampleWindow(src, 0, -80, 640, 640, f.size, f.size, det, 1/127.5, -1)
			crop := make([]float32, faceResSize*faceResSize*3)
			rotatedCrop(src, 320, 240, 200, 0, faceResSize, crop, 1, 0)
			fns = append(fns,
				func() time.Duration { return bareSlot(b, f.det, det) + bareSlot(b, f.emb, crop) },
				func() time.Duration {
					return timed(b, func() error {
						_, err := f.Faces(ctx, engine.FaceRequest{Image: img, Embeddings: true})
						return err
					})
				})
		}
		rotate(b, fns)
	})
	b.Run("detect", func(b *testing.B) {
		img := bench640(b, false)
		var fns []func() time.Duration
		for _, v := range []string{"on", "off"} {
			d := load(centerNetSpec(b), v).(*detector)
			in := make([]float32, d.size*d.size*3)
			resampleWindow(toRGBA(img), 0, 0, 640, 480, d.size, d.size, in, 1, 0)
			fns = append(fns,
				func() time.Duration { return bareSlot(b, d.m, in) },
				func() time.Duration {
					return timed(b, func() error { _, err := d.Detect(ctx, engine.DetectRequest{Image: img}); return err })
				})
		}
		rotate(b, fns)
	})
}

// rotate times the four functions (bare and pipeline with spinning on,
// the same with it off) once per iteration each: the settings in turns,
// which one first alternating, bare and pipeline alternating within a
// turn. Before each turn it sleeps 20 ms, long enough for the other
// engine's threads to stop spinning, so that they do not take cores from
// this turn's runs. It reports their median times.
func rotate(b *testing.B, fns []func() time.Duration) {
	b.Helper()
	for _, f := range fns {
		f() // warm up
	}
	times := make([][]time.Duration, len(fns))
	b.ResetTimer()
	for i := range b.N {
		for k := range 2 {
			set := 2 * ((i + k) % 2)
			time.Sleep(20 * time.Millisecond)
			for m := range 2 {
				j := set + (i/2+m)%2
				times[j] = append(times[j], fns[j]())
			}
		}
	}
	for j, name := range []string{"on-bare", "on-pipeline", "off-bare", "off-pipeline"} {
		slices.Sort(times[j])
		b.ReportMetric(times[j][len(times[j])/2].Seconds()*1e3, name+"-ms")
	}
}
