package transfer_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/infermesh/infermesh/mesh/forward"
	"github.com/infermesh/infermesh/mesh/transfer"
)

const secret = "transfer-test-secret"

// dirFiles serves the files of one folder as model "m".
type dirFiles struct {
	dir  string
	sums map[string]string
}

func (d dirFiles) Manifest(model string) ([]byte, error) {
	if model != "m" {
		return nil, transfer.ErrNotFound
	}
	return []byte(`{"id":"onnx/m/v1"}`), nil
}

func (d dirFiles) Open(model, file string) (io.ReadSeekCloser, int64, string, error) {
	sum, ok := d.sums[file]
	if model != "m" || !ok {
		return nil, 0, "", transfer.ErrNotFound
	}
	f, err := os.Open(filepath.Join(d.dir, file))
	if err != nil {
		return nil, 0, "", err
	}
	st, _ := f.Stat()
	return f, st.Size(), sum, nil
}

// peer writes a file of n random bytes and serves it over a real loopback
// server; it returns the server's address and the bytes.
func peer(tb testing.TB, n int, cfg transfer.ServerConfig) (string, *transfer.Server, []byte) {
	tb.Helper()
	data := make([]byte, n)
	rand.Read(data)
	dir := tb.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "model.onnx"), data, 0o644); err != nil {
		tb.Fatal(err)
	}
	s := sha256.Sum256(data)
	cfg.ClusterSecret = secret
	srv, err := transfer.NewServer(cfg, dirFiles{dir: dir, sums: map[string]string{"model.onnx": hex.EncodeToString(s[:])}}, nil, nil)
	if err != nil {
		tb.Fatal(err)
	}
	// The node mounts the handler on its RPC mux at the returned path; the
	// handler routes by that path itself, so it can serve alone here.
	_, h := srv.Handler()
	ts := httptest.NewUnstartedServer(nil)
	ts.Config = forward.NewHTTPServer(h, nil)
	ts.Start()
	tb.Cleanup(ts.Close)
	return strings.TrimPrefix(ts.URL, "http://"), srv, data
}

func TestFetchWholeAndFromOffset(t *testing.T) {
	addr, _, data := peer(t, 3<<20+17, transfer.ServerConfig{})
	c, err := transfer.NewClient("n2", secret)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var buf bytes.Buffer
	if err := c.Fetch(context.Background(), addr, "m", "model.onnx", 0, &buf); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), data) {
		t.Fatal("whole file differs")
	}
	buf.Reset()
	off := int64(len(data) / 3)
	if err := c.Fetch(context.Background(), addr, "m", "model.onnx", off, &buf); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), data[off:]) {
		t.Fatal("resumed tail differs")
	}
	if m, err := c.Manifest(context.Background(), addr, "m"); err != nil || !strings.Contains(string(m), "onnx/m/v1") {
		t.Fatalf("manifest %q %v", m, err)
	}
}

func TestRefusals(t *testing.T) {
	addr, srv, data := peer(t, 1024, transfer.ServerConfig{})
	wrong, _ := transfer.NewClient("intruder", "not-the-secret")
	defer wrong.Close()
	err := wrong.Fetch(context.Background(), addr, "m", "model.onnx", 0, io.Discard)
	if connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("fetch with a wrong secret: %v", err)
	}
	if _, err := wrong.Manifest(context.Background(), addr, "m"); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("manifest with a wrong secret: %v", err)
	}
	c, _ := transfer.NewClient("n2", secret)
	defer c.Close()
	for _, tc := range []struct {
		model, file string
		off         int64
		code        connect.Code
	}{
		{"m", "other.bin", 0, connect.CodeNotFound},
		{"x", "model.onnx", 0, connect.CodeNotFound},
		{"m", "model.onnx", int64(len(data)) + 1, connect.CodeOutOfRange},
		{"m", "model.onnx", -1, connect.CodeOutOfRange},
	} {
		if err := c.Fetch(context.Background(), addr, tc.model, tc.file, tc.off, io.Discard); connect.CodeOf(err) != tc.code {
			t.Errorf("%s/%s@%d: %v, want %s", tc.model, tc.file, tc.off, err, tc.code)
		}
	}
	srv.SetDraining(true)
	if err := c.Fetch(context.Background(), addr, "m", "model.onnx", 0, io.Discard); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("fetch from a draining node: %v", err)
	}
}

// failAfter fails the write that passes n bytes, like a disk or a dying
// connection would.
type failAfter struct {
	n int
	w bytes.Buffer
}

func (f *failAfter) Write(p []byte) (int, error) {
	if f.w.Len()+len(p) > f.n {
		return 0, errors.New("full")
	}
	return f.w.Write(p)
}

func TestWriterErrorStopsTheFetch(t *testing.T) {
	addr, _, _ := peer(t, 2<<20, transfer.ServerConfig{ChunkSize: 64 << 10})
	c, _ := transfer.NewClient("n2", secret)
	defer c.Close()
	w := &failAfter{n: 300 << 10}
	if err := c.Fetch(context.Background(), addr, "m", "model.onnx", 0, w); err == nil {
		t.Fatal("fetch succeeded although the writer failed")
	}
}

// TestConcurrentFetchesKeepTheirBytes: fetches running at once share the
// client's chunk buffers; each file still arrives exactly (a buffer is
// reused only after its bytes were written).
func TestConcurrentFetchesKeepTheirBytes(t *testing.T) {
	addr, _, data := peer(t, 3<<20+12345, transfer.ServerConfig{ChunkSize: 64 << 10})
	c, err := transfer.NewClient("n", secret)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	errs := make(chan error, 6)
	for i := range 6 {
		off := int64(i * 100003)
		go func() {
			var buf bytes.Buffer
			err := c.Fetch(context.Background(), addr, "m", "model.onnx", off, &buf)
			if err == nil && !bytes.Equal(buf.Bytes(), data[off:]) {
				err = fmt.Errorf("fetch from %d: bytes differ", off)
			}
			errs <- err
		}()
	}
	for range 6 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
