package models

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infermesh/infermesh/node/apierr"
)

// hub stands in for the outside source (a model hub): it serves files
// with Range support and counts requests; cut, when set, makes the first
// full GET of a file break off halfway.
type hub struct {
	files map[string][]byte
	gets  atomic.Int64
	// ranged records the Range headers seen.
	mu     sync.Mutex
	ranged []string
	cut    atomic.Bool
	delay  time.Duration
}

func (h *hub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.gets.Add(1)
	b, ok := h.files[strings.TrimPrefix(r.URL.Path, "/")]
	if !ok {
		http.NotFound(w, r)
		return
	}
	if rg := r.Header.Get("Range"); rg != "" {
		h.mu.Lock()
		h.ranged = append(h.ranged, rg)
		h.mu.Unlock()
	}
	if r.Header.Get("Range") == "" && h.cut.CompareAndSwap(true, false) {
		// Promise the whole file, send half, then drop the connection.
		w.Header().Set("Content-Length", fmt.Sprint(len(b)))
		w.WriteHeader(http.StatusOK)
		w.Write(b[:len(b)/2])
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	}
	if h.delay > 0 {
		// Send slowly so concurrent pulls overlap.
		w.Header().Set("Content-Length", fmt.Sprint(len(b)))
		for i := 0; i < len(b); i += len(b) / 8 {
			w.Write(b[i:min(i+len(b)/8, len(b))])
			w.(http.Flusher).Flush()
			time.Sleep(h.delay)
		}
		return
	}
	http.ServeContent(w, r, "f", time.Time{}, strings.NewReader(string(b)))
}

func randomBytes(t *testing.T, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func sum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// pullFixture is a store, a hub and a catalogue source listing one model
// whose two files the hub serves.
type pullFixture struct {
	store     *Store
	cat       *Catalog
	hub       *hub
	srv       *httptest.Server
	installed atomic.Int64
	key       string
	files     map[string][]byte
}

func newPullFixture(t *testing.T, corrupt bool) *pullFixture {
	t.Helper()
	f := &pullFixture{key: "onnx/test-enc/v1", files: map[string][]byte{
		"model.onnx": randomBytes(t, 1<<20), "tokenizer.json": []byte(`{"model":{"type":"WordPiece"}}`),
	}}
	f.hub = &hub{files: map[string][]byte{}}
	for n, b := range f.files {
		f.hub.files[n] = b
	}
	f.srv = httptest.NewServer(f.hub)
	t.Cleanup(f.srv.Close)
	var files []File
	for _, n := range []string{"model.onnx", "tokenizer.json"} {
		s := sum(f.files[n])
		if corrupt && n == "model.onnx" {
			s = sum([]byte("something else"))
		}
		files = append(files, File{Name: n, URL: f.srv.URL + "/" + n, Size: int64(len(f.files[n])), SHA256: s})
	}
	src := catalogFile{Entries: []Entry{{
		Listing: Listing{Key: f.key, DisplayName: "Test encoder", Modalities: []string{"embeddings"}},
		Install: Recipe{Name: "test-enc", Tag: "v1", Task: "embeddings", Files: map[string]string{"model": "model.onnx", "tokenizer": "tokenizer.json"}},
		Files:   files,
		Card:    &Card{Publisher: "tests", License: "MIT"},
	}}}
	b, _ := json.Marshal(src)
	path := filepath.Join(t.TempDir(), "catalog.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	var err error
	if f.cat, err = NewCatalog(context.Background(), []string{path}); err != nil {
		t.Fatal(err)
	}
	if st := f.cat.Status(); st[len(st)-1].Error != "" {
		t.Fatalf("test source did not load: %s", st[len(st)-1].Error)
	}
	if f.store, err = Open(t.TempDir(), slog.New(slog.DiscardHandler), time.Now); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *pullFixture) puller(t *testing.T) *Puller {
	p := NewPuller(PullConfig{Store: f.store, Catalog: f.cat, Retries: 3, ProgressEvery: time.Millisecond,
		Installed: func(*Manifest) error { f.installed.Add(1); return nil }})
	t.Cleanup(p.Close)
	return p
}

// collect follows a job to its end and checks the spec's order: started,
// progress with monotone completed, then exactly one done or error last.
func collect(t *testing.T, j *Job) []Event {
	t.Helper()
	ch, cancel := j.Subscribe()
	defer cancel()
	var out []Event
	timeout := time.After(60 * time.Second)
	for {
		select {
		case e, ok := <-ch:
			if !ok {
				checkOrder(t, out)
				return out
			}
			out = append(out, e)
		case <-timeout:
			t.Fatalf("pull did not finish; events so far %v", out)
		}
	}
}

func checkOrder(t *testing.T, evs []Event) {
	t.Helper()
	if len(evs) < 2 || evs[0].Type != "started" {
		t.Fatalf("events %v: want started first and a final event", evs)
	}
	var last int64
	for i, e := range evs[1 : len(evs)-1] {
		if e.Type != "progress" {
			t.Fatalf("event %d is %s, want progress between started and the end", i+1, e.Type)
		}
		if e.Progress.Completed < last || e.Progress.Completed > e.Progress.Total && e.Progress.Total > 0 {
			t.Fatalf("progress %+v after completed %d: not monotone or past total", e.Progress, last)
		}
		last = e.Progress.Completed
	}
	if end := evs[len(evs)-1].Type; end != "done" && end != "error" {
		t.Fatalf("last event %s, want done or error", end)
	}
}

func TestConcurrentPullsShareOneDownload(t *testing.T) {
	f := newPullFixture(t, false)
	f.hub.delay = 20 * time.Millisecond
	p := f.puller(t)
	j1, err := p.Pull(f.key)
	if err != nil {
		t.Fatal(err)
	}
	j2, err := p.Pull("test-enc:v1") // the wire id joins the same job
	if err != nil {
		t.Fatal(err)
	}
	if j1 != j2 {
		t.Fatal("a second pull of the same model started a second job")
	}
	var wg sync.WaitGroup
	var evs [2][]Event
	for i, j := range []*Job{j1, j2} {
		wg.Add(1)
		go func() { defer wg.Done(); evs[i] = collect(t, j) }()
	}
	wg.Wait()
	for i := range evs {
		last := evs[i][len(evs[i])-1]
		if last.Type != "done" {
			t.Fatalf("client %d ended with %+v", i, last)
		}
		if len(evs[i]) < 4 {
			t.Fatalf("client %d saw only %d events", i, len(evs[i]))
		}
	}
	if got := f.hub.gets.Load(); got != 2 {
		t.Fatalf("hub served %d requests, want 2 (one per file)", got)
	}
	m, err := f.store.Get(f.key)
	if err != nil {
		t.Fatal(err)
	}
	if m.SHA256["model.onnx"] != sum(f.files["model.onnx"]) || m.Card == nil || m.Card.Publisher != "tests" {
		t.Fatalf("installed manifest %+v", m)
	}
	if err := f.store.Verify(m); err != nil {
		t.Fatal(err)
	}
	if f.installed.Load() != 1 {
		t.Fatalf("installed callback ran %d times", f.installed.Load())
	}
	// A pull of an installed model ends at once with done.
	j3, _ := p.Pull(f.key)
	if evs := collect(t, j3); evs[len(evs)-1].Type != "done" || f.hub.gets.Load() != 2 {
		t.Fatalf("re-pull: %v, hub requests %d", evs, f.hub.gets.Load())
	}
}

func TestInterruptedDownloadResumes(t *testing.T) {
	f := newPullFixture(t, false)
	f.hub.cut.Store(true)
	p := f.puller(t)
	j, err := p.Pull(f.key)
	if err != nil {
		t.Fatal(err)
	}
	evs := collect(t, j)
	if last := evs[len(evs)-1]; last.Type != "done" {
		t.Fatalf("pull ended with %+v", last)
	}
	f.hub.mu.Lock()
	ranged := append([]string(nil), f.hub.ranged...)
	f.hub.mu.Unlock()
	want := fmt.Sprintf("bytes=%d-", len(f.files["model.onnx"])/2)
	if len(ranged) != 1 || ranged[0] != want {
		t.Fatalf("range requests %v, want one %q (resume at the cut)", ranged, want)
	}
	m, err := f.store.Get(f.key)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.store.Verify(m); err != nil {
		t.Fatal(err)
	}
}

func TestPartialFileFromAnEarlierPullIsResumed(t *testing.T) {
	f := newPullFixture(t, false)
	half := len(f.files["model.onnx"]) / 3
	dir := f.store.StagingDir(f.key)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "model.onnx.part"), f.files["model.onnx"][:half], 0o644); err != nil {
		t.Fatal(err)
	}
	// A store reopened after a crash keeps the staged bytes.
	store, err := Open(filepath.Dir(dir), slog.New(slog.DiscardHandler), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	f.store = store
	j, err := f.puller(t).Pull(f.key)
	if err != nil {
		t.Fatal(err)
	}
	evs := collect(t, j)
	if last := evs[len(evs)-1]; last.Type != "done" {
		t.Fatalf("pull ended with %+v", last)
	}
	if len(f.hub.ranged) != 1 || f.hub.ranged[0] != fmt.Sprintf("bytes=%d-", half) {
		t.Fatalf("range requests %v, want one from byte %d", f.hub.ranged, half)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("staging folder left behind: %v", err)
	}
}

func TestCorruptFileFailsAndInstallsNothing(t *testing.T) {
	f := newPullFixture(t, true)
	j, err := f.puller(t).Pull(f.key)
	if err != nil {
		t.Fatal(err)
	}
	evs := collect(t, j)
	last := evs[len(evs)-1]
	if last.Type != "error" || last.Code != apierr.CodeChecksumMismatch {
		t.Fatalf("pull ended with %+v, want error %s", last, apierr.CodeChecksumMismatch)
	}
	if _, err := f.store.Get(f.key); err == nil {
		t.Fatal("a model with a corrupt file was installed")
	}
	if len(f.store.List()) != 0 || f.installed.Load() != 0 {
		t.Fatal("something was installed")
	}
	if _, err := os.Stat(f.store.StagingDir(f.key)); !os.IsNotExist(err) {
		t.Fatalf("the corrupt download was kept: %v", err)
	}
}

func TestUnknownModelIsRefusedBeforeAnyEvent(t *testing.T) {
	f := newPullFixture(t, false)
	if _, err := f.puller(t).Pull("onnx/nope/nope"); err == nil || !strings.Contains(err.Error(), ErrUnknownModel.Error()) {
		t.Fatalf("pull of an unknown model: %v", err)
	}
}

// memPeer is a peer source backed by another store: the in-process side of
// what mesh/transfer carries between nodes (tested there over Connect).
type memPeer struct {
	id    string
	store *Store
	fail  atomic.Int64 // bytes after which Fetch fails once
}

func (p *memPeer) ID() string { return p.id }
func (p *memPeer) Manifest(_ context.Context, model string) (*Manifest, error) {
	b, err := p.store.ManifestJSON(model)
	if err != nil {
		return nil, err
	}
	return ParseManifest(b)
}
func (p *memPeer) Fetch(ctx context.Context, model, file string, off int64, w io.Writer) error {
	_, path, err := p.store.Path(model, file)
	if err != nil {
		return err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if n := p.fail.Swap(0); n > 0 {
		w.Write(b[off:n])
		return io.ErrUnexpectedEOF
	}
	_, err = w.Write(b[off:])
	return err
}

func TestPullPrefersPeersAndFallsOverBetweenThem(t *testing.T) {
	f := newPullFixture(t, false)
	// Install the model on a "peer" store through the hub first.
	seed := f.puller(t)
	j, _ := seed.Pull(f.key)
	collect(t, j)
	peerStore := f.store
	gets := f.hub.gets.Load()

	local, err := Open(t.TempDir(), slog.New(slog.DiscardHandler), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	a := &memPeer{id: "a", store: peerStore}
	a.fail.Store(int64(len(f.files["model.onnx"]) / 2))
	b := &memPeer{id: "b", store: peerStore}
	p := NewPuller(PullConfig{Store: local, Catalog: f.cat, Installed: func(*Manifest) error { return nil },
		Peers: func(string) []PeerSource { return []PeerSource{a, b} }})
	t.Cleanup(p.Close)
	j, err = p.Pull(f.key)
	if err != nil {
		t.Fatal(err)
	}
	evs := collect(t, j)
	if last := evs[len(evs)-1]; last.Type != "done" {
		t.Fatalf("pull ended with %+v", last)
	}
	if f.hub.gets.Load() != gets {
		t.Fatal("the outside source was used although peers had the model")
	}
	var sawA, sawB bool
	for _, e := range evs {
		sawA = sawA || strings.Contains(e.Progress.Phase, "from peer a")
		sawB = sawB || strings.Contains(e.Progress.Phase, "from peer b")
	}
	if !sawA || !sawB {
		t.Fatalf("phases did not show the move from peer a to peer b: %v", evs)
	}
	m, err := local.Get(f.key)
	if err != nil {
		t.Fatal(err)
	}
	if err := local.Verify(m); err != nil {
		t.Fatal(err)
	}
}

// heldPeer is a memPeer whose first Fetch waits for release, so that a
// second pull starts while the first is downloading; fetches counts the
// Fetch calls.
type heldPeer struct {
	memPeer
	fetching chan struct{} // closed when the first Fetch starts
	release  chan struct{}
	once     sync.Once
	fetches  atomic.Int64
}

func (p *heldPeer) Fetch(ctx context.Context, model, file string, off int64, w io.Writer) error {
	p.fetches.Add(1)
	first := false
	p.once.Do(func() { first = true; close(p.fetching) })
	if first {
		select {
		case <-p.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return p.memPeer.Fetch(ctx, model, file, off, w)
}

// TestPullsByWireAndCanonicalIDShareOneDownload: a model only a peer has
// (not in the catalogue), pulled by its wire id and, while that runs, by
// its canonical id: one download, both pulls succeed, one install. Before,
// the second pull knew the model only by the id it was given, started a
// second job into the same staging folder, and one of them failed.
func TestPullsByWireAndCanonicalIDShareOneDownload(t *testing.T) {
	f := newPullFixture(t, false)
	seed := f.puller(t) // the peer's copy, from the hub (the registry double)
	if evs := collect(t, mustPull(t, seed, f.key)); evs[len(evs)-1].Type != "done" {
		t.Fatalf("seeding the peer: %v", evs)
	}
	empty, err := NewCatalog(context.Background(), nil) // only the peer has it
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := empty.Get(f.key); ok {
		t.Fatal("the built-in catalogue lists the test model")
	}
	local, err := Open(t.TempDir(), slog.New(slog.DiscardHandler), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	peer := &heldPeer{memPeer: memPeer{id: "a", store: f.store}, fetching: make(chan struct{}), release: make(chan struct{})}
	var installs atomic.Int64
	p := NewPuller(PullConfig{Store: local, Catalog: empty, Installed: func(*Manifest) error { installs.Add(1); return nil },
		Peers: func(string) []PeerSource { return []PeerSource{peer} }})
	t.Cleanup(p.Close)

	byWire := mustPull(t, p, "test-enc:v1")
	<-peer.fetching // the first pull is downloading
	byID := mustPull(t, p, f.key)
	close(peer.release)
	var wg sync.WaitGroup
	var evs [2][]Event
	for i, j := range []*Job{byWire, byID} {
		wg.Add(1)
		go func() { defer wg.Done(); evs[i] = collect(t, j) }()
	}
	wg.Wait()
	for i, e := range evs {
		if last := e[len(e)-1]; last.Type != "done" {
			t.Errorf("pull %d ended with %+v", i, last)
		}
	}
	if got, want := peer.fetches.Load(), int64(len(f.files)); got != want {
		t.Errorf("%d file fetches, want %d (one download)", got, want)
	}
	if installs.Load() != 1 {
		t.Errorf("installed %d times, want once", installs.Load())
	}
	m, err := local.Get("test-enc:v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := local.Verify(m); err != nil {
		t.Fatal(err)
	}
}

func mustPull(t *testing.T, p *Puller, key string) *Job {
	t.Helper()
	j, err := p.Pull(key)
	if err != nil {
		t.Fatal(err)
	}
	return j
}
