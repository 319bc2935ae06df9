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
		idle, err := rt.ForModel(engine.Spec{ID: "m", Options: map[string]string{onnx.ArenaOption: "30s"}})
		if err != nil || !idle.KeepsArena() || idle.ArenaIdle() != 30*time.Second {
			t.Fatalf("%s=30s: keeps %v, idle %v (%v)", onnx.ArenaOption, idle.KeepsArena(), idle.ArenaIdle(), err)
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
// (released_held_MB, arena_held_MB). Then speed: three removers loaded
// side by side, the arena released, kept, and kept with an idle release of
// 1ms (so every one of its runs follows a release: the worst case of a
// duration setting), each iteration runs one request on each in rotating
// order; released_ms, arena_ms and idle_ms are the mean run times, x_time
// = released / arena and x_idle = idle / arena (above 1: slower).
//
//	go test -run '^$' -bench ArenaISNet -benchtime 10x ./node/engine/onnx
func BenchmarkArenaISNet(b *testing.B) {
	src := photo(b)
	_, relHeld := isnetHeld(b, arenaRuntime(b, true), nil, src)
	_, arenaHeld := isnetHeld(b, arenaRuntime(b, false), nil, src)
	load := func(release bool, options map[string]string) engine.BackgroundRemover {
		br, err := arenaRuntime(b, release).LoadBackgroundRemover(isnetSpec(b, options))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { br.Close() })
		if _, err := br.RemoveBackground(context.Background(), src); err != nil { // warm up
			b.Fatal(err)
		}
		return br
	}
	sides := []engine.BackgroundRemover{load(true, nil), load(false, nil), load(false, map[string]string{onnx.ArenaOption: "1ms"})}
	var took [3]time.Duration
	b.ResetTimer()
	i := 0
	for b.Loop() {
		for k := range sides {
			s := (i + k) % len(sides)
			t0 := time.Now()
			if _, err := sides[s].RemoveBackground(context.Background(), src); err != nil {
				b.Fatal(err)
			}
			took[s] += time.Since(t0)
		}
		i++
	}
	b.StopTimer()
	const mb = 1 << 20
	ms := func(d time.Duration) float64 { return d.Seconds() * 1000 / float64(i) }
	b.ReportMetric(float64(relHeld)/mb, "released_held_MB")
	b.ReportMetric(float64(arenaHeld)/mb, "arena_held_MB")
	b.ReportMetric(ms(took[0]), "released_ms")
	b.ReportMetric(ms(took[1]), "arena_ms")
	b.ReportMetric(ms(took[2]), "idle_ms")
	b.ReportMetric(took[0].Seconds()/took[1].Seconds(), "x_time")
	b.ReportMetric(took[2].Seconds()/took[1].Seconds(), "x_idle")
}

// With memory_arena set to a duration, the arena is kept across runs and
// given back once the model has been idle that long: after one ISNet run
// the process holds the run's memory, and some time after, without another
// run, it drops back to under half of that growth. The engine still serves
// afterwards, and the duration form parses as the node flag does.
func TestIdleArenaIsGivenBack(t *testing.T) {
	if a, err := onnx.ParseArena("250ms"); err != nil || a.Release || a.Idle != 250*time.Millisecond {
		t.Fatalf("ParseArena(250ms) = %+v, %v", a, err)
	}
	for _, bad := range []string{"", "0s", "-1m", "shrink"} {
		if _, err := onnx.ParseArena(bad); err == nil {
			t.Fatalf("ParseArena(%q) accepted", bad)
		}
	}
	src := photo(t)
	rt := arenaRuntime(t, false)
	br, err := rt.LoadBackgroundRemover(isnetSpec(t, map[string]string{onnx.ArenaOption: "500ms"}))
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	loaded := residentBytes(t)
	if _, err := br.RemoveBackground(context.Background(), src); err != nil {
		t.Fatal(err)
	}
	grown := residentBytes(t) - loaded
	const mb = 1 << 20
	if grown < 100*mb {
		t.Fatalf("one ISNet run with the arena grew the process by %d MB; want the arena to hold its activations", grown/mb)
	}
	// Wait (not a timing assertion: the bound is only how long to look)
	// for the idle release to rebuild the session.
	deadline := time.Now().Add(2 * time.Minute)
	held := grown
	for held*2 > grown {
		if time.Now().After(deadline) {
			t.Fatalf("the process still holds %d of the run's %d MB two minutes after it", held/mb, grown/mb)
		}
		time.Sleep(100 * time.Millisecond)
		held = residentBytes(t) - loaded
	}
	t.Logf("ISNet 1024, memory_arena=500ms: the run grew the process by %d MB; idle, it holds %d MB of that", grown/mb, held/mb)
	if _, err := br.RemoveBackground(context.Background(), src); err != nil {
		t.Fatalf("after the idle release: %v", err)
	}
}
