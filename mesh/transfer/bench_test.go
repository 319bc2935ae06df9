package transfer_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/infermesh/infermesh/mesh/transfer"
)

// BenchmarkPeerTransfer copies a 64 MiB model file over loopback to a file
// on disk, side by side in one run: through mesh/transfer (Connect stream
// with the cluster secret) and through a plain net/http file server read
// with io.Copy (the baseline). It reports both rates and their ratio.
func BenchmarkPeerTransfer(b *testing.B) {
	const size = 64 << 20
	addr, _, data := peer(b, size, transfer.ServerConfig{})
	dir := b.TempDir()
	src := filepath.Join(dir, "src.bin")
	if err := os.WriteFile(src, data, 0o644); err != nil {
		b.Fatal(err)
	}
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.ServeFile(w, r, src) }))
	defer plain.Close()
	c, _ := transfer.NewClient("bench", secret)
	defer c.Close()
	hc := &http.Client{Transport: &http.Transport{DisableCompression: true}}

	copyTo := func(fetch func(w io.Writer) error) time.Duration {
		out, err := os.Create(filepath.Join(dir, "dst.bin"))
		if err != nil {
			b.Fatal(err)
		}
		defer out.Close()
		start := time.Now()
		if err := fetch(out); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	viaMesh := func(w io.Writer) error { return c.Fetch(context.Background(), addr, "m", "model.onnx", 0, w) }
	viaHTTP := func(w io.Writer) error {
		resp, err := hc.Get(plain.URL)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, err = io.Copy(w, resp.Body)
		return err
	}
	copyTo(viaMesh) // warm both paths
	copyTo(viaHTTP)
	var mesh, http time.Duration
	b.SetBytes(size)
	copyTo(viaMesh) // warm up, and check the copy is exact
	if got, err := os.ReadFile(filepath.Join(dir, "dst.bin")); err != nil || !bytes.Equal(got, data) {
		b.Fatalf("the copy through the mesh differs from the file (%v)", err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		mesh += copyTo(viaMesh)
		http += copyTo(viaHTTP)
	}
	mb := float64(size) * float64(b.N) / (1 << 20)
	b.ReportMetric(mb/mesh.Seconds(), "mesh_MiB/s")
	b.ReportMetric(mb/http.Seconds(), "http_MiB/s")
	b.ReportMetric(http.Seconds()/mesh.Seconds(), "mesh/http")
}
