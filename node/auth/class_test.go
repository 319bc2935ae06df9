package auth

import (
	"crypto/sha256"
	"strings"
	"testing"
	"time"
)

func TestClassifyEverySpecEndpoint(t *testing.T) {
	cases := []struct {
		method, path string
		class        Class
		counted      bool
	}{
		{"POST", "/v1/chat/completions", ClassChat, true},
		{"POST", "/v1/embeddings", ClassEmbeddings, true},
		{"POST", "/v1/batch/embeddings", ClassEmbeddings, true},
		{"GET", "/v1/batch/embeddings", ClassEmbeddings, false},
		{"GET", "/v1/batch/embeddings/job_42", ClassEmbeddings, false},
		{"DELETE", "/v1/batch/embeddings/job_42", ClassEmbeddings, false},
		{"POST", "/v1/images/generations", ClassImages, true},
		{"POST", "/v1/images/describe", ClassImages, true},
		{"POST", "/v1/audio/speech", ClassAudio, true},
		{"POST", "/v1/audio/transcriptions", ClassAudio, true},
		{"POST", "/v1/audio/translations", ClassAudio, true},
		{"GET", "/v1/audio/transcriptions/stream", ClassAudio, true},
		{"POST", "/v1/audio/clone", ClassAudio, true},
		{"POST", "/v1/vision/detections", ClassVision, true},
		{"POST", "/v1/vision/faces", ClassVision, true},
		{"POST", "/v1/vision/background", ClassVision, true},
		{"GET", "/v1/models", ClassModels, false},
		{"GET", "/v1/models/", ClassModels, false},
		{"GET", "/v1/models/onnx/bert/mini", ClassModels, false},
		{"GET", "/v1/models/catalog", ClassModels, false},
		{"GET", "/v1/models/installed", ClassModels, false},
		{"POST", "/v1/models/catalog/refresh", ClassAdmin, false},
		{"DELETE", "/v1/models/onnx/bert/mini", ClassAdmin, false},
		{"POST", "/v1/models/pull", ClassPull, true},
		{"GET", "/v1/server/models/onnx/bert/mini/provenance", ClassModels, false},
		{"GET", "/v1/server/usage", ClassUsage, false},
		{"GET", "/v1/server/metrics", ClassMetrics, false},
		{"GET", "/v1/server/keys", ClassAdmin, false},
		{"POST", "/v1/server/keys", ClassAdmin, false},
		{"DELETE", "/v1/server/keys/key_1", ClassAdmin, false},
		{"GET", "/v1/server/policy", ClassAdmin, false},
		{"GET", "/v1/server/members", ClassAdmin, false},
		{"GET", "/dashboard", ClassProbes, false},
		{"GET", "/dashboard/data", ClassMetrics, false},
		{"GET", "/readyz", ClassProbes, false},
		{"POST", "/v1/responses", ClassUnknown, false},
		{"GET", "/", ClassUnknown, false},
		{"POST", "/api/chat", ClassChat, true},
		{"POST", "/api/generate", ClassChat, true},
		{"POST", "/api/embed", ClassEmbeddings, true},
		{"GET", "/api/tags", ClassModels, false},
		{"POST", "/api/pull", ClassPull, true},
		{"DELETE", "/api/delete", ClassAdmin, false},
	}
	for _, tc := range cases {
		if got := Classify(tc.method, tc.path); got != tc.class {
			t.Errorf("Classify(%s %s) = %s, want %s", tc.method, tc.path, got, tc.class)
		}
		if got := Counted(tc.method, tc.path); got != tc.counted {
			t.Errorf("Counted(%s %s) = %v, want %v", tc.method, tc.path, got, tc.counted)
		}
	}
}

func TestClassNames(t *testing.T) {
	names := AllowlistNames()
	want := "chat embeddings images audio vision models pull usage admin metrics"
	if got := strings.Join(names, " "); got != want {
		t.Fatalf("AllowlistNames = %q, want %q", got, want)
	}
	for _, n := range names {
		c, ok := ParseClass(n)
		if !ok || c.String() != n {
			t.Errorf("ParseClass(%q) = %v, %v", n, c, ok)
		}
	}
	for _, bad := range []string{"probes", "unknown", "", "Chat"} {
		if _, ok := ParseClass(bad); ok {
			t.Errorf("ParseClass(%q) accepted", bad)
		}
	}
}

func TestNewKey(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 200; i++ {
		p, h := NewKey()
		if !strings.HasPrefix(p, KeyPrefix) || len(p) != len(KeyPrefix)+keyLen {
			t.Fatalf("key %q has the wrong shape", p)
		}
		for _, c := range p[len(KeyPrefix):] {
			if !strings.ContainsRune(keyChars, c) {
				t.Fatalf("key %q has %q outside base62", p, c)
			}
		}
		if h != sha256.Sum256([]byte(p)) || h != HashKey(p) {
			t.Fatalf("hash of %q is not its SHA-256", p)
		}
		if seen[p] {
			t.Fatalf("key %q generated twice", p)
		}
		seen[p] = true
	}
}

func TestKeyActive(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		k    Key
		want bool
	}{
		{Key{}, true},
		{Key{ExpiresAt: now.Add(time.Nanosecond)}, true},
		{Key{ExpiresAt: now}, false},
		{Key{Revoked: true}, false},
	}
	for _, tc := range cases {
		if got := tc.k.Active(now); got != tc.want {
			t.Errorf("%+v.Active = %v, want %v", tc.k, got, tc.want)
		}
	}
}

func TestStaticKeysCopies(t *testing.T) {
	p, h := NewKey()
	s := NewStaticKeys(Key{ID: "k", Hash: h, Endpoints: []string{"chat"}})
	k, ok := s.KeyByHash(HashKey(p))
	if !ok || k.ID != "k" {
		t.Fatalf("lookup: %+v %v", k, ok)
	}
	k.Endpoints[0] = "admin"
	if k2, _ := s.KeyByHash(h); k2.Endpoints[0] != "chat" {
		t.Fatal("a caller changed the stored allowlist")
	}
	s.Put(Key{ID: "k", Hash: h, Revoked: true})
	if k3, _ := s.KeyByHash(h); !k3.Revoked {
		t.Fatal("Put did not replace the key")
	}
}

func TestLoopbackOnly(t *testing.T) {
	cases := map[string]bool{
		"127.0.0.1:11436": true,
		"127.0.0.2:80":    true,
		"[::1]:8080":      true,
		"localhost:1":     true,
		":8080":           false,
		"0.0.0.0:8080":    false,
		"[::]:8080":       false,
		"10.0.0.5:8080":   false,
		"example.org:80":  false,
	}
	for addr, want := range cases {
		if got := LoopbackOnly(addr); got != want {
			t.Errorf("LoopbackOnly(%q) = %v, want %v", addr, got, want)
		}
	}
}

func TestRetryAfterSeconds(t *testing.T) {
	cases := map[time.Duration]int{0: 1, time.Millisecond: 1, time.Second: 1, 1500 * time.Millisecond: 2, time.Minute: 60}
	for d, want := range cases {
		if got := RetryAfterSeconds(d); got != want {
			t.Errorf("RetryAfterSeconds(%v) = %d, want %d", d, got, want)
		}
	}
}
