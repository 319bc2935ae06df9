package node_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
)

// residentOf reads path (a model list) from n and returns the
// resident_bytes of the entry whose idField is id, and whether it is there.
func residentOf(t *testing.T, addr, path, idField, id string) (int64, bool) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []map[string]any `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	for _, e := range list.Data {
		if e[idField] == id {
			b, _ := e["resident_bytes"].(float64)
			return int64(b), true
		}
	}
	return 0, false
}

// A loaded model's memory shows in the node's model list, in the
// OpenAI-shaped list (an extra field) and as a gauge; it stays positive
// after the model's first request adds the run's growth.
func TestModelListShowsResidentBytes(t *testing.T) {
	n := runNode(t, "mem-a", []string{"tiny-bert"}, nil)
	body := fmt.Sprintf(`{"model":%q,"input":["the weather is fine","a second line of input"]}`, bertWire)
	if code, _, out := post(t, n.Addr(), "/v1/embeddings", body, nil); code != http.StatusOK {
		t.Fatalf("embeddings: %d %s", code, out)
	}
	installed, ok := residentOf(t, n.Addr(), "/v1/models/installed", "key", bertID)
	if !ok || installed <= 0 {
		t.Fatalf("/v1/models/installed: %s resident_bytes %d (listed %v), want > 0", bertID, installed, ok)
	}
	listed, ok := residentOf(t, n.Addr(), "/v1/models", "id", bertID)
	if !ok || listed != installed {
		t.Fatalf("/v1/models: %s resident_bytes %d (listed %v), want %d", bertID, listed, ok, installed)
	}
	v, ok := value(families(t, scrape(t, n)), "infermesh_model_resident_bytes", map[string]string{"model": bertID})
	if !ok || int64(v) != installed {
		t.Fatalf("infermesh_model_resident_bytes{model=%q} = %v (present %v), want %d", bertID, v, ok, installed)
	}
	t.Logf("%s holds %.1f MB", bertID, float64(installed)/(1<<20))
}
