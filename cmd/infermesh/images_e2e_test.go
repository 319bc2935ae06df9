package main

import (
	"bytes"
	"image"
	"image/color"
	"image/png"
	"io"
	"net/http"
	"sync"
	"testing"
)

// Eight concurrent 40-megapixel PNGs (small files that decompress 200x)
// queue on the node's decoded-image budget instead of adding up: RSS
// stays under the documented bound and every request is answered.
func TestLargeImagesStayInBudget(t *testing.T) {
	const budget = 1 << 30
	p := startNode(t, "big-images", "isnet")
	// Warm the model first so its runtime arena is part of the baseline.
	small := image.NewNRGBA(image.Rect(0, 0, 64, 64))
	var sb bytes.Buffer
	png.Encode(&sb, small)
	resp, err := removeBackground(t, p, sb.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	decodeBackground(t, resp)
	base := rssBytes(t, p.cmd.Process.Pid)

	img := image.NewGray(image.Rect(0, 0, 8000, 5000))
	for y := 0; y < 5000; y++ {
		for x := 0; x < 8000; x++ {
			img.SetGray(x, y, color.Gray{Y: uint8((x / 500) * 16)})
		}
	}
	var buf bytes.Buffer
	enc := png.Encoder{CompressionLevel: png.BestCompression}
	if err := enc.Encode(&buf, img); err != nil {
		t.Fatal(err)
	}
	photo := buf.Bytes()
	t.Logf("request image: 8000x5000 PNG of %d KB", len(photo)>>10)

	var wg sync.WaitGroup
	var mu sync.Mutex
	peak := base
	statuses := map[int]int{}
	stop, sampled := make(chan struct{}), make(chan struct{})
	go func() { // sample RSS while the requests run
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if r, ok := readRSS(p.cmd.Process.Pid); ok {
				mu.Lock()
				peak = max(peak, r)
				mu.Unlock()
			}
		}
	}()
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := removeBackground(t, p, photo)
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			mu.Lock()
			statuses[resp.StatusCode]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(stop)
	<-sampled
	mu.Lock()
	defer mu.Unlock()
	t.Logf("statuses %v; RSS %d MiB warm, peak %d MiB (image budget %d MiB)", statuses, base>>20, peak>>20, budget>>20)
	if statuses[http.StatusOK] != 8 {
		t.Fatalf("statuses %v, want 8 x 200", statuses)
	}
	// Bound: the warm node, the image budget, and 512 MiB for request and
	// response bodies in flight (8 x the small PNG, base64 answers).
	if limit := base + budget + 512<<20; peak > limit {
		t.Fatalf("peak RSS %d MiB over the bound %d MiB", peak>>20, limit>>20)
	}
}
