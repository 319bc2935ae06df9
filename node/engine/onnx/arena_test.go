package onnx_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// residentBytes is the process's resident set size.
func residentBytes(t testing.TB) int64 {
	t.Helper()
	n, err := readStatm()
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

func TestArenaOption(t *testing.T) {
	rt := arenaRuntime(t, false)
	for _, v := range []string{"", "on", "off"} {
		opts, err := rt.SessionOptionsFor(engine.Spec{ID: "m", Options: map[string]string{onnx.ArenaOption: v}})
		if err != nil {
			t.Fatalf("%s=%q: %v", onnx.ArenaOption, v, err)
		}
		opts.Destroy()
	}
	if _, err := rt.SessionOptionsFor(engine.Spec{ID: "m", Options: map[string]string{onnx.ArenaOption: "maybe"}}); err == nil {
		t.Fatalf("%s=maybe accepted", onnx.ArenaOption)
	}
}

// With the arena released, memory an ISNet run took goes back once the run
// ends: what the process holds after the run, over what it held after
// loading, is under half of what a session with the arena keeps. The
// released case runs first, so the arena's memory cannot hide its growth.
func TestReleasedArenaGivesRunMemoryBack(t *testing.T) {
	src := photo(t)
	held := func(release bool) (load, run int64) {
		rt := arenaRuntime(t, release)
		before := residentBytes(t)
		br, err := rt.LoadBackgroundRemover(isnetSpec(t, nil))
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
	relLoad, relRun := held(true)
	arenaLoad, arenaRun := held(false)
	const mb = 1 << 20
	t.Logf("ISNet 1024: load adds %d MB (released) / %d MB (arena); after one run the process holds %d MB more (released) / %d MB more (arena)",
		relLoad/mb, arenaLoad/mb, relRun/mb, arenaRun/mb)
	if relRun*2 > arenaRun {
		t.Fatalf("released arena still holds %d MB after a run, the arena %d MB; want under half", relRun/mb, arenaRun/mb)
	}
}

// BenchmarkArena measures what releasing the arena costs in speed: ISNet
// at 1024x1024 (large activations) and tiny-bert embeddings (many small
// runs), each with the arena kept and released, in alternating order.
func BenchmarkArena(b *testing.B) {
	for _, release := range []bool{true, false} {
		name := "arena"
		if release {
			name = "released"
		}
		rt := arenaRuntime(b, release)
		b.Run("isnet/"+name, func(b *testing.B) {
			br, err := rt.LoadBackgroundRemover(isnetSpec(b, nil))
			if err != nil {
				b.Fatal(err)
			}
			defer br.Close()
			src := photo(b)
			for b.Loop() {
				if _, err := br.RemoveBackground(context.Background(), src); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(residentBytes(b))/(1<<20), "rss_MB")
		})
	}
}

// readStatm returns the process's resident set size from
// /proc/self/statm (Linux); ONNX Runtime does not report what its arenas
// hold.
func readStatm() (int64, error) {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0, fmt.Errorf("onnx: /proc/self/statm: %q", b)
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("onnx: /proc/self/statm: %w", err)
	}
	return pages * int64(os.Getpagesize()), nil
}
