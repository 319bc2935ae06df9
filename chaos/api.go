package chaos

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/infermesh/infermesh/node/apierr"
)

// This file is the harness's view of the node HTTP API beyond the OpenAI
// routes. Endpoints marked "coming" are being wired by the integrator; their
// shapes follow the agreed contract, and each parser is one small function so
// a change in shape is a change in one place.

// Response is what the harness keeps of one HTTP answer.
type Response struct {
	// Status is the HTTP status (0 when no answer arrived).
	Status int
	// Backend is X-Service-Backend.
	Backend string
	// RetryAfter is the Retry-After header.
	RetryAfter string
	// Code and Message are the OpenAI error's code and message, if any.
	Code, Message string
	// Body is the body (at most 1 MiB kept).
	Body []byte
}

// API calls a node's HTTP API with the admin key.
type API struct {
	hc    *http.Client
	admin string
}

// NewAPI returns an API client; adminKey goes into every request.
func NewAPI(hc *http.Client, adminKey string) *API { return &API{hc: hc, admin: adminKey} }

// Do sends one request with bearer key (the admin key when empty) and a JSON
// body (nil for none), and reads the answer.
func (a *API) Do(ctx context.Context, method, rawURL, key string, body any) (Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return Response{}, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, rawURL, rd)
	if err != nil {
		return Response{}, err
	}
	if key == "" {
		key = a.admin
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return readResponse(a.hc.Do(req))
}

// readResponse turns an http answer into a Response.
func readResponse(res *http.Response, err error) (Response, error) {
	if err != nil {
		return Response{}, err
	}
	defer res.Body.Close()
	r := Response{Status: res.StatusCode, Backend: res.Header.Get("X-Service-Backend"), RetryAfter: res.Header.Get("Retry-After")}
	r.Body, err = io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return r, fmt.Errorf("read body after status %d: %w", res.StatusCode, err)
	}
	if res.StatusCode >= 400 {
		var e struct {
			Error struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal(r.Body, &e) == nil {
			r.Code, r.Message = e.Error.Code, truncate(e.Error.Message, 200)
		}
	}
	return r, nil
}

// StatusError is a non-2xx answer to a harness call.
type StatusError struct {
	// What names the call that got the answer (e.g. "state-digest",
	// "members").
	What string
	// Status is the HTTP status of the answer.
	Status int
	// Code is the OpenAI error code of the answer ("" when it had none).
	Code string
}

// Error implements error.
func (e *StatusError) Error() string {
	return fmt.Sprintf("%s: status %d %s", e.What, e.Status, e.Code)
}

// AuthRefused reports an answer that refused the caller's key (401, 403, or
// the wrong-key throttle's 429): asking again soon only makes it worse.
func (e *StatusError) AuthRefused() bool {
	return e.Status == 401 || e.Status == 403 || e.Code == apierr.CodeTooManyFailedAuth
}

// NewControlClient returns the HTTP client for the harness's own calls
// (readiness, state digest, members, key setup, routability). It dials from
// its own source address, 127.0.0.201: the load uses 127.0.0.1 and the key
// probes 127.0.0.200, so a node that throttles one client address for wrong
// keys never blinds the harness, nor the harness the load. tlsCfg is the
// client TLS of a secured run (nil: the nodes speak cleartext).
func NewControlClient(timeout time.Duration, tlsCfg *tls.Config) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{MaxIdleConnsPerHost: 4, IdleConnTimeout: 30 * time.Second, TLSClientConfig: tlsCfg,
		DialContext: (&net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 201)}}).DialContext}}
}

// DigestInfo is GET /v1/server/state-digest (coming).
type DigestInfo struct {
	// Digest identifies the node's replicated state; nodes holding the same
	// state report the same digest.
	Digest string `json:"digest"`
	// AppliedIndex is the last raft log index the node has applied.
	AppliedIndex uint64 `json:"applied_index"`
	// Leader is the node id of the raft leader as this node sees it ("" when
	// it knows none).
	Leader string `json:"leader"`
}

// StateDigest reads a node's replicated-state digest and its view of the
// leader.
func (a *API) StateDigest(ctx context.Context, base string) (DigestInfo, error) {
	res, err := a.Do(ctx, http.MethodGet, base+"/v1/server/state-digest", "", nil)
	if err != nil {
		return DigestInfo{}, err
	}
	if res.Status != http.StatusOK {
		return DigestInfo{}, &StatusError{What: "state-digest", Status: res.Status, Code: res.Code}
	}
	var d DigestInfo
	if err := json.Unmarshal(res.Body, &d); err != nil {
		return DigestInfo{}, fmt.Errorf("state-digest: %w", err)
	}
	return d, nil
}

// Member is one peer in a node's membership view.
type Member struct {
	// ID is the peer's node id.
	ID string `json:"id"`
	// State is the peer's state as the node reports it (e.g. "alive", "ready",
	// "saturated"); see Healthy.
	State string `json:"state"`
	// Ejected: the node took the peer out of routing after a refused
	// connection, before gossip said anything.
	Ejected bool `json:"ejected"`
}

// Healthy reports whether the peer is routable: alive, ready or saturated
// (in the mesh, taking work when it has room) and not ejected.
func (m Member) Healthy() bool {
	if m.Ejected {
		return false
	}
	switch strings.ToLower(m.State) {
	case "alive", "ready", "saturated":
		return true
	}
	return false
}

// Members reads GET /v1/server/members (coming).
func (a *API) Members(ctx context.Context, base string) ([]Member, error) {
	res, err := a.Do(ctx, http.MethodGet, base+"/v1/server/members", "", nil)
	if err != nil {
		return nil, err
	}
	if res.Status != http.StatusOK {
		return nil, &StatusError{What: "members", Status: res.Status, Code: res.Code}
	}
	return parseMembers(res.Body)
}

// parseMembers reads {"data":[{"id","state","ejected",...}]} (what the node
// serves); it also accepts a bare list or one under "members" or "peers",
// and "node_id"/"name", "status"/"health" for the id and the state.
func parseMembers(body []byte) ([]Member, error) {
	var list []map[string]any
	if err := json.Unmarshal(body, &list); err != nil {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(body, &obj); err != nil {
			return nil, fmt.Errorf("members: not JSON: %w", err)
		}
		for _, k := range []string{"data", "members", "peers"} {
			if raw, ok := obj[k]; ok {
				if err := json.Unmarshal(raw, &list); err != nil {
					return nil, fmt.Errorf("members: %q is not a list: %w", k, err)
				}
				break
			}
		}
		if list == nil {
			return nil, fmt.Errorf("members: no list in %.200s", body)
		}
	}
	str := func(m map[string]any, keys ...string) string {
		for _, k := range keys {
			if s, ok := m[k].(string); ok && s != "" {
				return s
			}
		}
		return ""
	}
	out := make([]Member, 0, len(list))
	for _, m := range list {
		id := str(m, "id", "node_id", "name")
		if id == "" {
			return nil, fmt.Errorf("members: a peer without id: %v", m)
		}
		ejected, _ := m["ejected"].(bool)
		out = append(out, Member{ID: id, State: str(m, "state", "status", "health"), Ejected: ejected})
	}
	return out, nil
}

// KeySpec is the body of POST /v1/server/keys (coming).
type KeySpec struct {
	// Name is the key's name; the harness gives every key a unique one.
	Name string `json:"name"`
	// App is the application the key belongs to (the harness uses "chaos").
	App string `json:"app"`
	// Admin lets the key use the admin API.
	Admin bool `json:"admin"`
	// Allow is the endpoint allowlist (e.g. "models", "embeddings"); empty
	// allows every endpoint.
	Allow []string `json:"allow,omitempty"`
	// RPM limits requests per minute (0: unlimited).
	RPM int64 `json:"rpm"`
	// DailyQuota limits counted requests per UTC day (0: unlimited).
	DailyQuota int64 `json:"daily_quota"`
	// MonthlyBudget limits the estimated cost per month (0: unlimited).
	MonthlyBudget int64 `json:"monthly_budget"`
}

// CreatedKey is the answer to a key creation: the id and, once, the key.
type CreatedKey struct {
	// ID identifies the key in later calls (revoke, list).
	ID string `json:"id"`
	// Key is the secret itself; no later answer contains it.
	Key string `json:"key"`
}

// CreateKey creates a key through the node at base.
func (a *API) CreateKey(ctx context.Context, base string, spec KeySpec) (CreatedKey, Response, error) {
	res, err := a.Do(ctx, http.MethodPost, base+"/v1/server/keys", "", spec)
	if err != nil || res.Status/100 != 2 {
		return CreatedKey{}, res, err
	}
	var k CreatedKey
	if err := json.Unmarshal(res.Body, &k); err != nil || k.ID == "" || k.Key == "" {
		return CreatedKey{}, res, fmt.Errorf("create key: answer without id and key: %.200s", res.Body)
	}
	return k, res, nil
}

// KeyInfo is one entry of GET /v1/server/keys.
type KeyInfo struct {
	// ID is the id the key was created with.
	ID string `json:"id"`
	// Name is the name the key was created with.
	Name string `json:"name"`
	// Revoked is true once the key's revoke has reached this node (the list is
	// a local read).
	Revoked bool `json:"revoked"`
}

// ListKeys lists the keys a node knows (a local read).
func (a *API) ListKeys(ctx context.Context, base string) ([]KeyInfo, Response, error) {
	res, err := a.Do(ctx, http.MethodGet, base+"/v1/server/keys", "", nil)
	if err != nil || res.Status != http.StatusOK {
		return nil, res, err
	}
	var body struct {
		Data []KeyInfo `json:"data"`
	}
	if err := json.Unmarshal(res.Body, &body); err != nil || body.Data == nil {
		return nil, res, fmt.Errorf("list keys: no data list in %.200s", res.Body)
	}
	return body.Data, res, nil
}

// RevokeKey revokes a key by id.
func (a *API) RevokeKey(ctx context.Context, base, id string) (Response, error) {
	return a.Do(ctx, http.MethodDelete, base+"/v1/server/keys/"+url.PathEscape(id), "", nil)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
