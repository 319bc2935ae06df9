package main

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// Two clients pull one model at once into the same node, one by its wire
// id and one by its canonical id; only a peer has it (ISNet small is in
// no catalogue entry). Both pulls succeed and the peer sends the file
// once. Loopback prefix 127.0.96.x is this file's.
func TestPullByBothIdsAtOnceSharesOneDownload(t *testing.T) {
	// A slow holder, so the second pull starts while the first downloads.
	holder := startMeshNode(t, meshNode{"ids-a", "127.0.96.1", []string{"isnet"}}, "", "--transfer-rate", "8000000")
	fresh := startMeshNode(t, meshNode{"ids-b", "127.0.96.2", nil}, "127.0.96.1:17946")
	waitMembers(t, []*proc{holder, fresh}, 2)
	const wire, canonical = "isnet:small", "onnx/isnet/general-use-small"
	size := int64(len(mustReadFile(t, filepath.Join(onnxtest.AssetDir(t, "isnet", "model.onnx"), "model.onnx"))))

	downloading := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	results := map[string][]sseEvent{}
	var mu sync.Mutex
	pull := func(key string, on func(sseEvent)) {
		defer wg.Done()
		code, ecode, evs, err := pullVia(fresh, key, "", on)
		mu.Lock()
		defer mu.Unlock()
		if err != nil || code != http.StatusOK {
			t.Errorf("pull %s: %d %s %v", key, code, ecode, err)
		}
		results[key] = evs
	}
	wg.Add(2)
	go pull(wire, func(e sseEvent) {
		if ph, _ := e.Data["phase"].(string); strings.HasPrefix(ph, "downloading") {
			once.Do(func() { close(downloading) })
		}
	})
	<-downloading
	go pull(canonical, nil)
	wg.Wait()
	for key, evs := range results {
		if len(evs) == 0 || evs[len(evs)-1].Name != "done" {
			t.Errorf("pull %s ended with %v", key, evs)
		}
	}
	// The holder sent the model once.
	sentF, err := metricValue(holder, "infermesh_transfer_sent_bytes_total")
	sent := int64(sentF)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("two pulls by %s and %s; the holder sent %d bytes for a %d-byte model", wire, canonical, sent, size)
	if sent < size || sent >= 2*size {
		t.Errorf("the holder sent %d bytes; want one copy of %d", sent, size)
	}
	resp, err := http.Get(fresh.url("/v1/models/installed"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var inst struct {
		Data []struct{ Key string } `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&inst); err != nil || len(inst.Data) != 1 || inst.Data[0].Key != canonical {
		t.Errorf("installed after the pulls: %+v %v", inst, err)
	}
}
