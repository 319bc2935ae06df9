package onnx_test

import (
	"context"
	"image"
	"testing"
	"time"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// residentBytes is the process's resident set size.
func residentBytes(t testing.TB) int64 {
	t.Helper()
	n, err := onnx.ResidentBytes()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// arenaRuntime is a runtime whose sessions keep (release=false) or drop the
// CPU memory arena.
func arenaRuntime(t testing.TB, release bool) *onnx.Runtime {
	t.Helper()
	rt, err := onnx.NewRuntime(onnx.Config{LibraryPath: onnxtest.LibraryPath(t), ReleaseArena: release})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	return rt
}

// A model's memory_arena option overrides the node's setting both ways,
// an empty one follows it, a view of a view keeps the first view's choice,
// and any other value is refused.
func TestArenaOption(t *testing.T) {
	for _, release := range []bool{false, true} {
		rt := arenaRuntime(t, release)
		if rt.KeepsArena() == release {
			t.Fatalf("ReleaseArena %v: node handle keeps arena %v", release, rt.KeepsArena())
		}
		for v, want := range map[string]bool{"": !release, "on": true, "off": false} {
			view, err := rt.ForModel(engine.Spec{ID: "m", Options: map[string]string{onnx.ArenaOption: v}})
			if err != nil {
				t.Fatalf("%s=%q: %v", onnx.ArenaOption, v, err)
			}
			if view.KeepsArena() != want {
				t.Fatalf("ReleaseArena %v, %s=%q: keeps arena %v, want %v", release, onnx.ArenaOption, v, view.KeepsArena(), want)
			}
			inner, err := view.ForModel(engine.Spec{ID: "m/sub"})
			if err != nil || inner.KeepsArena() != want {
				t.Fatalf("view of a view: keeps arena %v (%v), want %v", inner.KeepsArena(), err, want)
			}
			opts, err := view.SessionOptions()
			if err != nil {
				t.Fatal(err)
			}
			opts.Destroy()
			if err := view.Close(); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := rt.ForModel(engine.Spec{ID: "m", Options: map[string]string{onnx.ArenaOption: "maybe"}}); err == nil {
			t.Fatalf("%s=maybe accepted", onnx.ArenaOption)
		}
		// Closing the views left the node's handle usable.
		if _, err := rt.LoadBackgroundRemover(engine.Spec{ID: "m", Options: map[string]string{onnx.ArenaOption: "maybe"}}); err == nil {
			t.Fatal("a loader accepted memory_arena=maybe")
		}
	}
	var nilRT *onnx.Runtime
	if _, err := nilRT.ForModel(engine.Spec{ID: "m"}); err == nil {
		t.Fatal("a nil runtime gave a view")
	}
}

// isnetHeld loads ISNet on rt with options, runs it once on src and
// returns what the process grew by across the load and what it still
// holds after the run over what it held after the load.
func isnetHeld(t testing.TB, rt *onnx.Runtime, options map[string]string, src image.Image) (load, run int64) {
	t.Helper()
	before := residentBytes(t)
	br, err := rt.LoadBackgroundRemover(isnetSpec(t, options))
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	loaded := residentBytes(t)
	if _, err := br.RemoveBackground(context.Background(), src); err != nil {
		t.Fatal(err)
	}
	return loaded - before, residentBytes(t) - loaded
}

// With the arena released, memory an ISNet run took goes back once the run
// ends: what the process holds after the run, over what it held after
// loading, is under half of what a session with the arena keeps. The
// model's memory_arena option decides against the node's setting each
// time (off on a node that keeps the arena, on on a node that releases
// it), so the test also shows the option reaching the pipeline. The
// released case runs first, so the arena's memory cannot hide its growth.
func TestReleasedArenaGivesRunMemoryBack(t *testing.T) {
	src := photo(t)
	relLoad, relRun := isnetHeld(t, arenaRuntime(t, false), map[string]string{onnx.ArenaOption: "off"}, src)
	arenaLoad, arenaRun := isnetHeld(t, arenaRuntime(t, true), map[string]string{onnx.ArenaOption: "on"}, src)
	const mb = 1 << 20
	t.Logf("ISNet 1024: load adds %d MB (released) / %d MB (arena); after one run the process holds %d MB more (released) / %d MB more (arena)",
		relLoad/mb, arenaLoad/mb, relRun/mb, arenaRun/mb)
	if relRun*2 > arenaRun {
		t.Fatalf("released arena still holds %d MB after a run, the arena %d MB; want under half", relRun/mb, arenaRun/mb)
	}
}

// BenchmarkArenaISNet measures what releasing the arena costs in speed and
// saves in memory on ISNet at 1024x1024 (background removal, the largest
// activations of the project's pipelines). Memory first: one load and run
// with the arena released, then one with it kept, each reporting what the
// process holds after the run over what it held after the load
// (released_held_MB, arena_held_MB). Then speed: both removers loaded side
// by side, each iteration runs one request on each in alternating order;
// released_ms and arena_ms are the mean run times and x_time their ratio
// (released / arena; above 1 means releasing costs time).
//
//	go test -run '^$' -bench ArenaISNet -benchtime 10x ./node/engine/onnx
func BenchmarkArenaISNet(b *testing.B) {
	src := photo(b)
	_, relHeld := isnetHeld(b, arenaRuntime(b, true), nil, src)
	_, arenaHeld := isnetHeld(b, arenaRuntime(b, false), nil, src)
	load := func(release bool) engine.BackgroundRemover {
		br, err := arenaRuntime(b, release).LoadBackgroundRemover(isnetSpec(b, nil))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { br.Close() })
		if _, err := br.RemoveBackground(context.Background(), src); err != nil { // warm up
			b.Fatal(err)
		}
		return br
	}
	rel, kept := load(true), load(false)
	var relTime, keptTime time.Duration
	b.ResetTimer()
	i := 0
	for b.Loop() {
		order := []engine.BackgroundRemover{rel, kept}
		if i%2 == 1 {
			order = []engine.BackgroundRemover{kept, rel}
		}
		i++
		for _, br := range order {
			t0 := time.Now()
			if _, err := br.RemoveBackground(context.Background(), src); err != nil {
				b.Fatal(err)
			}
			if br == rel {
				relTime += time.Since(t0)
			} else {
				keptTime += time.Since(t0)
			}
		}
	}
	b.StopTimer()
	const mb = 1 << 20
	b.ReportMetric(float64(relHeld)/mb, "released_held_MB")
	b.ReportMetric(float64(arenaHeld)/mb, "arena_held_MB")
	b.ReportMetric(relTime.Seconds()*1000/float64(i), "released_ms")
	b.ReportMetric(keptTime.Seconds()*1000/float64(i), "arena_ms")
	b.ReportMetric(relTime.Seconds()/keptTime.Seconds(), "x_time")
}
