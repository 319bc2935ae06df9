package chaos

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// Mix weighs the request types; a type with weight 0 is not sent.
type Mix map[OpKind]int

// DefaultMix is the everyday mix: mostly embeddings, some chat (plain and
// streamed, when a chat model is installed), model lists, and a steady
// trickle of key writes, reads and probes. Vision is off (about 2.5 s of
// CPU per call on this machine).
func DefaultMix() Mix {
	return Mix{OpEmbedSDK: 30, OpEmbedRaw: 12, OpChatSDK: 4, OpChatSSE: 6, OpModelsSDK: 8, OpModelsRaw: 4,
		OpKeyCreate: 6, OpKeyRevoke: 4, OpKeyList: 8, OpKeyProbe: 10, OpQuota: 7}
}

// KeyHeavyMix puts key writes and reads first (the split-brain scenario).
func KeyHeavyMix() Mix {
	return Mix{OpEmbedSDK: 20, OpEmbedRaw: 5, OpModelsSDK: 5,
		OpKeyCreate: 20, OpKeyRevoke: 12, OpKeyList: 18, OpKeyProbe: 15, OpQuota: 5}
}

// LoadConfig configures the load generator.
type LoadConfig struct {
	// Rate is requests per second over all types and nodes.
	Rate float64
	// Duration is how long requests are started.
	Duration time.Duration
	// Mix weighs the types.
	Mix Mix
	// MaxInflight bounds requests in flight; a tick beyond it is dropped
	// (and counted).
	MaxInflight int
	// Timeout bounds one request.
	Timeout time.Duration
	// Model is the embeddings model id.
	Model string
	// ChatModel is the chat model id ("" disables chat); ChatTokens
	// bounds each answer.
	ChatModel string
	// ChatTokens is the max_tokens of each chat request (default 8).
	ChatTokens int
	// DataKey authenticates inference traffic; AdminKey the key admin calls.
	DataKey, AdminKey string
	// Keys enables key writes and reads (the key admin API exists).
	Keys bool
	// ProbeKeys enables probes (nodes are not loopback-only, so a key is
	// checked on every request).
	ProbeKeys bool
	// QuotaKey, when set, is a key with a daily quota used by OpQuota.
	QuotaKey string
	// KeyPrefix names the keys the load creates.
	KeyPrefix string
	// Image is a PNG for vision requests (nil disables them).
	Image []byte
	// Seed makes choices repeatable.
	Seed uint64
	// TLS is the client TLS of a secured run (nil: cleartext).
	TLS *tls.Config
}

// KeyEntry is what the load knows about one key it tried to create.
type KeyEntry struct {
	// Name is the key's unique name: KeyPrefix and a counter.
	Name string `json:"name"`
	// ID is the id the acknowledged create returned ("" until then).
	ID    string `json:"id,omitempty"`
	plain string
	// CreateAcked: the create answered 2xx at CreateAt.
	CreateAcked bool `json:"create_acked"`
	// CreateAt is when the create's 2xx answer arrived, as an offset from the
	// scenario start.
	CreateAt time.Duration `json:"create_at_ns"`
	// CreateCalled is when the create was sent.
	CreateCalled time.Duration `json:"create_called_ns"`
	// RevokeCalled is when the first revoke was sent (0: never).
	RevokeCalled time.Duration `json:"revoke_called_ns,omitempty"`
	// RevokeAcked: a revoke answered 2xx at RevokeAt.
	RevokeAcked bool `json:"revoke_acked"`
	// RevokeAt is when the revoke's 2xx answer arrived (0: not acknowledged).
	RevokeAt time.Duration `json:"revoke_at_ns,omitempty"`
	revoking bool
}

// Load sends the mix through every live node and records every request.
type Load struct {
	cfg    LoadConfig
	cl     *Cluster
	rec    *Recorder
	hc     *http.Client
	probe  *http.Client
	api    *API
	sdk    map[string]openai.Client
	sem    chan struct{}
	wg     sync.WaitGroup
	drop   atomic.Int64
	noNode atomic.Int64
	seq    atomic.Int64

	mu   sync.Mutex
	rng  *rand.Rand
	rr   int
	keys []*KeyEntry
}

// NewLoad prepares a load generator against cl, recording into rec.
func NewLoad(cfg LoadConfig, cl *Cluster, rec *Recorder) *Load {
	if cfg.MaxInflight <= 0 {
		cfg.MaxInflight = 128
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.ChatTokens <= 0 {
		cfg.ChatTokens = 8
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 32, IdleConnTimeout: 30 * time.Second, TLSClientConfig: cfg.TLS,
		DialContext: (&net.Dialer{Timeout: 2 * time.Second}).DialContext}
	// Probes come from their own address, so that a node throttling a
	// client that sends revoked keys throttles only the probes.
	ptr := &http.Transport{DisableKeepAlives: true, TLSClientConfig: cfg.TLS, DialContext: (&net.Dialer{Timeout: 2 * time.Second,
		LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 200)}}).DialContext}
	l := &Load{cfg: cfg, cl: cl, rec: rec, hc: &http.Client{Transport: tr}, probe: &http.Client{Transport: ptr},
		sdk: map[string]openai.Client{}, sem: make(chan struct{}, cfg.MaxInflight),
		rng: rand.New(rand.NewPCG(cfg.Seed, 0x9e3779b97f4a7c15))}
	l.api = NewAPI(l.hc, cfg.AdminKey)
	for _, n := range cl.Nodes() {
		l.sdk[n.ID] = openai.NewClient(option.WithBaseURL(n.BaseURL()+"/v1/"), option.WithAPIKey(cfg.DataKey),
			option.WithHTTPClient(l.hc), option.WithMaxRetries(0))
	}
	return l
}

// Dropped is the count of ticks not sent because MaxInflight was reached;
// NoNode the count of ticks with no live node to send to.
func (l *Load) Dropped() (inflight, noNode int64) { return l.drop.Load(), l.noNode.Load() }

// Keys returns a copy of the key book.
func (l *Load) Keys() []KeyEntry {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]KeyEntry, len(l.keys))
	for i, k := range l.keys {
		out[i] = *k
	}
	return out
}

// ForgetConnections drops idle connections (after a node died, so that a
// dead pooled connection is not mistaken for a failure of a live node).
func (l *Load) ForgetConnections() { l.hc.CloseIdleConnections() }

// Run sends requests at the configured rate for the configured duration,
// then waits for those in flight. The number of requests is bounded by
// rate × duration.
func (l *Load) Run(ctx context.Context) {
	if l.cfg.Rate <= 0 || l.cfg.Duration <= 0 {
		return
	}
	interval := time.Duration(float64(time.Second) / l.cfg.Rate)
	limit := int(l.cfg.Rate * l.cfg.Duration.Seconds())
	ctx, cancel := context.WithTimeout(ctx, l.cfg.Duration+time.Second)
	defer cancel()
	// Request i is due at start + i·interval: a slow loop catches up
	// instead of silently lowering the rate (as a Ticker would).
	start := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for i := 0; i < limit; i++ {
		timer.Reset(time.Until(start.Add(time.Duration(i) * interval)))
		select {
		case <-ctx.Done():
			l.wg.Wait()
			return
		case <-timer.C:
		}
		kind, entry := l.pick()
		if entry == "" {
			l.noNode.Add(1)
			continue
		}
		select {
		case l.sem <- struct{}{}:
		default:
			l.drop.Add(1)
			continue
		}
		l.wg.Add(1)
		go func() {
			defer func() { <-l.sem; l.wg.Done() }()
			// Requests outlive the sending window by at most Timeout.
			rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.Timeout)
			defer rcancel()
			l.Do(rctx, kind, entry)
		}()
	}
	l.wg.Wait()
}

// pick chooses the next type by weight and the next entry node round-robin
// among nodes a client could still be talking to (up, draining, paused).
func (l *Load) pick() (OpKind, string) {
	live := l.cl.InState(StateUp, StateDraining, StateStopped)
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(live) == 0 {
		return "", ""
	}
	l.rr++
	entry := live[l.rr%len(live)]
	total := 0
	kinds := make([]OpKind, 0, len(l.cfg.Mix))
	for _, k := range []OpKind{OpEmbedSDK, OpEmbedRaw, OpChatSDK, OpChatSSE, OpModelsSDK, OpModelsRaw, OpKeyCreate,
		OpKeyRevoke, OpKeyList, OpKeyProbe, OpQuota, OpVision} {
		if w := l.cfg.Mix[k]; w > 0 && l.enabled(k) {
			total += w
			kinds = append(kinds, k)
		}
	}
	if total == 0 {
		return "", ""
	}
	x := l.rng.IntN(total)
	for _, k := range kinds {
		if x < l.cfg.Mix[k] {
			return k, entry
		}
		x -= l.cfg.Mix[k]
	}
	return kinds[len(kinds)-1], entry
}

func (l *Load) enabled(k OpKind) bool {
	switch k {
	case OpKeyCreate, OpKeyRevoke, OpKeyList:
		return l.cfg.Keys
	case OpKeyProbe:
		return l.cfg.Keys && l.cfg.ProbeKeys
	case OpQuota:
		return l.cfg.QuotaKey != ""
	case OpVision:
		return l.cfg.Image != nil
	case OpChatSDK, OpChatSSE:
		return l.cfg.ChatModel != ""
	}
	return true
}

// Do sends one request of kind through entry and records it.
func (l *Load) Do(ctx context.Context, kind OpKind, entry string) *Record {
	n := l.cl.Node(entry)
	rec := &Record{Kind: kind, Entry: entry, Start: l.rec.Since()}
	var res Response
	var err error
	switch kind {
	case OpEmbedSDK:
		res, err = l.embedSDK(ctx, entry)
	case OpEmbedRaw:
		res, err = l.api.Do(ctx, http.MethodPost, n.BaseURL()+"/v1/embeddings", l.cfg.DataKey, l.embedBody())
	case OpQuota:
		res, err = l.api.Do(ctx, http.MethodPost, n.BaseURL()+"/v1/embeddings", l.cfg.QuotaKey, l.embedBody())
	case OpChatSDK:
		res, err = l.chatSDK(ctx, entry)
	case OpChatSSE:
		res, err = l.chatStream(ctx, entry)
	case OpModelsSDK:
		res, err = l.modelsSDK(ctx, entry)
	case OpModelsRaw:
		res, err = l.api.Do(ctx, http.MethodGet, n.BaseURL()+"/v1/models/installed", l.cfg.DataKey, nil)
	case OpVision:
		res, err = l.api.Do(ctx, http.MethodPost, n.BaseURL()+"/v1/vision/background", l.cfg.DataKey,
			map[string]string{"image": "data:image/png;base64," + b64(l.cfg.Image)})
	case OpKeyCreate:
		res, err = l.keyCreate(ctx, n, rec)
	case OpKeyRevoke:
		res, err = l.keyRevoke(ctx, n, rec)
	case OpKeyList:
		res, err = l.keyList(ctx, n, rec)
	case OpKeyProbe:
		res, err = l.keyProbe(ctx, n, rec)
	}
	rec.End = l.rec.Since()
	rec.Status, rec.Backend, rec.Code, rec.Msg, rec.RetryAfter = res.Status, res.Backend, res.Code, res.Message, res.RetryAfter != ""
	if err != nil {
		rec.Err = err.Error()
		rec.Timeout = errors.Is(err, context.DeadlineExceeded) || isTimeout(err)
	}
	l.rec.Add(rec)
	return rec
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func (l *Load) embedBody() map[string]any {
	i := l.seq.Add(1)
	return map[string]any{"model": l.cfg.Model, "input": []string{"chaos request " + strconv.FormatInt(i, 10), "the quick brown fox"}}
}

// sdkResponse turns the SDK's answer into a Response.
func sdkResponse(httpRes *http.Response, err error) (Response, error) {
	var res Response
	if httpRes != nil {
		res.Status, res.Backend, res.RetryAfter = httpRes.StatusCode, httpRes.Header.Get("X-Service-Backend"), httpRes.Header.Get("Retry-After")
	}
	var apiErr *openai.Error
	if errors.As(err, &apiErr) {
		res.Status, res.Code, res.Message = apiErr.StatusCode, apiErr.Code, truncate(apiErr.Message, 200)
		if apiErr.Response != nil {
			res.Backend, res.RetryAfter = apiErr.Response.Header.Get("X-Service-Backend"), apiErr.Response.Header.Get("Retry-After")
		}
		return res, nil
	}
	if err != nil && res.Status/100 == 2 {
		return res, fmt.Errorf("status %d but: %w", res.Status, err) // a body that broke off
	}
	return res, err
}

func (l *Load) embedSDK(ctx context.Context, entry string) (Response, error) {
	var httpRes *http.Response
	c := l.sdk[entry]
	out, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{
		Model: openai.EmbeddingModel(l.cfg.Model),
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"chaos sdk " + strconv.FormatInt(l.seq.Add(1), 10), "hello world"}},
	}, option.WithResponseInto(&httpRes))
	res, err := sdkResponse(httpRes, err)
	if err == nil && res.Status/100 == 2 && (out == nil || len(out.Data) != 2 || len(out.Data[0].Embedding) == 0) {
		return res, errors.New("embeddings answer without two vectors")
	}
	return res, err
}

func (l *Load) modelsSDK(ctx context.Context, entry string) (Response, error) {
	var httpRes *http.Response
	c := l.sdk[entry]
	page, err := c.Models.List(ctx, option.WithResponseInto(&httpRes))
	res, err := sdkResponse(httpRes, err)
	if err == nil && res.Status/100 == 2 && (page == nil || len(page.Data) == 0) {
		return res, errors.New("model list is empty")
	}
	return res, err
}
