package node

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infermesh/infermesh/mesh/route"
	"github.com/infermesh/infermesh/node/api"
	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx"
)

// This file holds the node's own Prometheus series: per-model requests,
// errors, latency, tokens and time to first token as the entry node sees
// them, per-worker requests, and collectors read at scrape time over the
// mesh table (per-peer health, in-flight, cap, saturation), raft and the
// loaded engines (queues, batch sizes, prefix caches). Everything is
// registered on the node's own registry.

// observer holds the node's request series and its tracing.
type observer struct {
	n *Node

	requests *prometheus.CounterVec   // model, code
	errs     *prometheus.CounterVec   // model, kind
	duration *prometheus.HistogramVec // model
	tokens   *prometheus.CounterVec   // model, type
	ttft     *prometheus.HistogramVec // model
	workers  *prometheus.CounterVec   // worker, code
	workerD  *prometheus.HistogramVec // worker

	trace *tracing
}

// latencyBuckets spans 5 ms to about 80 s.
func latencyBuckets() []float64 { return prometheus.ExponentialBuckets(0.005, 2, 15) }

// newObserver registers the node's request series and the engines'
// collector on n.reg and sets up tracing from the OTEL_* environment.
func newObserver(n *Node) (*observer, error) {
	o := &observer{
		n: n,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infermesh_model_requests_total",
			Help: "Model requests this node admitted as the entry node, by model and HTTP status code of the answer.",
		}, []string{"model", "code"}),
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infermesh_model_errors_total",
			Help: "Model requests that failed, by model and kind: client (4xx), server (5xx) or aborted (broke off after the response started).",
		}, []string{"model", "kind"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "infermesh_model_request_duration_seconds",
			Help:    "Time from the request's arrival to the end of its response, by model, as the entry node sees it.",
			Buckets: latencyBuckets(),
		}, []string{"model"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infermesh_model_tokens_total",
			Help: "Tokens the serving nodes reported for requests admitted here, by model and type (prompt, completion).",
		}, []string{"model", "type"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "infermesh_model_time_to_first_token_seconds",
			Help:    "For streamed (server-sent events) answers: time from the request's arrival to the first event sent to the client, by model.",
			Buckets: latencyBuckets(),
		}, []string{"model"}),
		workers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infermesh_worker_requests_total",
			Help: "Model requests admitted here, by the node that served them (worker) and HTTP status code.",
		}, []string{"worker", "code"}),
		workerD: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "infermesh_worker_request_duration_seconds",
			Help:    "Time from arrival to the end of the response of model requests admitted here, by the node that served them.",
			Buckets: latencyBuckets(),
		}, []string{"worker"}),
	}
	for _, c := range []prometheus.Collector{o.requests, o.errs, o.duration, o.tokens, o.ttft, o.workers, o.workerD, newEngineCollector(n)} {
		if err := n.reg.Register(c); err != nil {
			return nil, err
		}
	}
	var err error
	if o.trace, err = newTracing(n.cfg.NodeID, n.cfg.Version, n.log); err != nil {
		return nil, err
	}
	return o, nil
}

// registerCluster adds the collectors over the mesh table and raft; the
// node calls it once the cluster is up.
func (o *observer) registerCluster(c *cluster) error {
	return errors.Join(o.n.reg.Register(newPeerCollector(c)), o.n.reg.Register(c.raft.RaftCollector()))
}

// served records a model request admitted here once its answer is
// complete: the admission's done func calls it with the outcome.
func (o *observer) served(r *http.Request, model string, s api.Served) {
	t := timingFrom(r.Context())
	code := strconv.Itoa(s.Status)
	o.requests.WithLabelValues(model, code).Inc()
	switch {
	case s.Aborted:
		o.errs.WithLabelValues(model, "aborted").Inc()
	case s.Status >= 500:
		o.errs.WithLabelValues(model, "server").Inc()
	case s.Status >= 400:
		o.errs.WithLabelValues(model, "client").Inc()
	}
	if s.PromptTokens > 0 {
		o.tokens.WithLabelValues(model, "prompt").Add(float64(s.PromptTokens))
	}
	if s.CompletionTokens > 0 {
		o.tokens.WithLabelValues(model, "completion").Add(float64(s.CompletionTokens))
	}
	if s.Backend != "" {
		o.workers.WithLabelValues(s.Backend, code).Inc()
	}
	if t == nil {
		return
	}
	d := o.n.clock().Sub(t.start).Seconds()
	o.duration.WithLabelValues(model).Observe(d)
	if s.Backend != "" {
		o.workerD.WithLabelValues(s.Backend).Observe(d)
	}
	if first := t.first.Load(); first != 0 && t.stream.Load() && s.Status < 300 && !s.Aborted {
		o.ttft.WithLabelValues(model).Observe(time.Duration(first - t.start.UnixNano()).Seconds())
	}
}

// handler wraps the node's public API handler: it notes when the request
// arrived and when its first body byte left (for the latency and
// time-to-first-token series) and, with tracing on, runs the request in
// the entry span.
func (o *observer) handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t := &timing{start: o.n.clock(), clock: o.n.clock}
		r, span := o.trace.startEntry(r)
		tw := &timingWriter{ResponseWriter: w, t: t}
		defer func() { endSpan(span, tw.code()) }()
		h.ServeHTTP(tw, r.WithContext(context.WithValue(r.Context(), timingKey{}, t)))
	})
}

// close flushes and stops the tracer.
func (o *observer) close(ctx context.Context) {
	if o != nil {
		o.trace.close(ctx)
	}
}

type timingKey struct{}

// timing is when a request arrived and when its first body byte was
// written.
type timing struct {
	start  time.Time
	clock  func() time.Time
	first  atomic.Int64 // unix nanos; 0 until the first body byte
	stream atomic.Bool  // the answer is an event stream
}

func timingFrom(ctx context.Context) *timing {
	t, _ := ctx.Value(timingKey{}).(*timing)
	return t
}

// timingWriter notes the status and, with t set, the first body byte of
// a response.
type timingWriter struct {
	http.ResponseWriter
	t       *timing
	status  int
	written bool
}

// WriteHeader notes the status and whether the answer is an event stream.
func (w *timingWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
		if w.t != nil && strings.HasPrefix(w.Header().Get("Content-Type"), "text/event-stream") {
			w.t.stream.Store(true)
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write notes the first body byte.
func (w *timingWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if !w.written && len(b) > 0 {
		w.written = true
		if w.t != nil && w.t.first.Load() == 0 {
			w.t.first.Store(w.t.clock().UnixNano())
		}
	}
	return w.ResponseWriter.Write(b)
}

// code is the status sent (200 when the handler wrote nothing).
func (w *timingWriter) code() int {
	if w.status == 0 {
		return http.StatusOK
	}
	return w.status
}

// Flush passes through so event streams are not buffered.
func (w *timingWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Hijack passes through for WebSocket upgrades.
func (w *timingWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if h, ok := w.ResponseWriter.(http.Hijacker); ok {
		return h.Hijack()
	}
	return nil, nil, errors.New("hijack not supported")
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *timingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// peerDescs are the per-peer series, read from the mesh table.
type peerDescs struct {
	health, ejected, inflight, cap, saturation, queue, age, models, latency, canary *prometheus.Desc
	// The routing settings by source: own (what the peer gossips), policy
	// (the routing policy's entry, when it has one) and effective (what
	// routing uses).
	rWeight, rCanary, rCap *prometheus.Desc
}

func newPeerCollector(c *cluster) peerCollector {
	return peerCollector{c: c, d: peerDescs{
		health:     prometheus.NewDesc("infermesh_peer_health", "1 for the serving state the peer last reported (unknown, alive, ready, saturated, draining), 0 for the others; this node included.", []string{"peer", "state"}, nil),
		ejected:    prometheus.NewDesc("infermesh_peer_ejected", "1 while this node routes nothing to the peer after a refused connection.", []string{"peer"}, nil),
		inflight:   prometheus.NewDesc("infermesh_peer_inflight_requests", "Requests the peer reported serving in its last record.", []string{"peer"}, nil),
		cap:        prometheus.NewDesc("infermesh_peer_inflight_cap", "The peer's in-flight cap (0: none).", []string{"peer"}, nil),
		saturation: prometheus.NewDesc("infermesh_peer_saturation_ratio", "The peer's in-flight requests over its cap (1 or more: full; 0 without a cap), or 1 when it reports itself saturated.", []string{"peer"}, nil),
		queue:      prometheus.NewDesc("infermesh_peer_queue_depth", "Requests waiting in the peer's engines, as it last reported.", []string{"peer"}, nil),
		age:        prometheus.NewDesc("infermesh_peer_record_age_seconds", "Age of the peer's last gossiped record.", []string{"peer"}, nil),
		models:     prometheus.NewDesc("infermesh_peer_models", "Models the peer reported, by state (installed, warm).", []string{"peer", "state"}, nil),
		latency:    prometheus.NewDesc("infermesh_peer_model_latency_seconds", "The peer's moving average of the time to serve a request, by model (absent before the first measurement).", []string{"peer", "model"}, nil),
		canary:     prometheus.NewDesc("infermesh_peer_canary", "1 when the peer is a canary node.", []string{"peer"}, nil),
		rWeight: prometheus.NewDesc("infermesh_peer_routing_weight", "The peer's weight for the weighted strategy, by source: own (gossiped), policy (the routing policy's entry, absent without one), effective (what routing uses).",
			[]string{"peer", "source"}, nil),
		rCanary: prometheus.NewDesc("infermesh_peer_routing_canary_percent", "The share of callers (0-100) the peer receives as a canary, -1 when it is no canary, by source (own, policy, effective).",
			[]string{"peer", "source"}, nil),
		rCap: prometheus.NewDesc("infermesh_peer_routing_inflight_cap", "The peer's in-flight cap (0: none; in a policy entry: the peer's own), by source (own, policy, effective).",
			[]string{"peer", "source"}, nil),
	}}
}

// peerCollector reads the mesh table at scrape time.
type peerCollector struct {
	c *cluster
	d peerDescs
}

// Describe sends the per-peer descriptors.
func (p peerCollector) Describe(ch chan<- *prometheus.Desc) {
	d := p.d
	for _, x := range []*prometheus.Desc{d.health, d.ejected, d.inflight, d.cap, d.saturation, d.queue, d.age, d.models, d.latency, d.canary, d.rWeight, d.rCanary, d.rCap} {
		ch <- x
	}
}

// Collect reads every peer's view.
func (p peerCollector) Collect(ch chan<- prometheus.Metric) {
	if p.c.mesh == nil {
		return
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	d := p.d
	now := time.Now()
	rv := routingOf(p.c)
	routing := func(r api.Routing, id, source string) {
		gauge(d.rWeight, float64(r.Weight), id, source)
		canary := -1.0
		if r.Canary {
			canary = float64(r.CanaryPercent)
		}
		gauge(d.rCanary, canary, id, source)
		gauge(d.rCap, float64(r.Cap), id, source)
	}
	for _, peer := range p.c.mesh.Peers() {
		id := peer.ID
		for _, h := range []route.Health{route.HealthUnknown, route.HealthAlive, route.HealthReady, route.HealthSaturated, route.HealthDraining} {
			gauge(d.health, b2f(peer.Health == h), id, h.String())
		}
		gauge(d.ejected, b2f(peer.Ejected), id)
		gauge(d.inflight, float64(peer.InFlight), id)
		gauge(d.cap, float64(max(peer.MaxInFlight, 0)), id)
		sat := 0.0
		if peer.MaxInFlight > 0 {
			sat = float64(peer.InFlight) / float64(peer.MaxInFlight)
		}
		if peer.Health == route.HealthSaturated {
			sat = max(sat, 1)
		}
		gauge(d.saturation, sat, id)
		gauge(d.queue, float64(peer.QueueDepth), id)
		if !peer.Updated.IsZero() {
			gauge(d.age, max(now.Sub(peer.Updated).Seconds(), 0), id)
		}
		warm := 0
		for model, m := range peer.Models {
			if m.Warm {
				warm++
			}
			if m.Latency > 0 {
				gauge(d.latency, m.Latency.Seconds(), id, model)
			}
		}
		gauge(d.models, float64(len(peer.Models)), id, "installed")
		gauge(d.models, float64(warm), id, "warm")
		gauge(d.canary, b2f(peer.Canary), id)
		routing(routingOfPeer(peer), id, "own")
		if pr := rv.policy(id); pr != nil {
			routing(*pr, id, "policy")
		}
		routing(routingOfPeer(rv.effective(peer)), id, "effective")
	}
}

// engineDescs are the per-model series of the loaded engines.
type engineDescs struct {
	queue, batchSize, running, capacity, kv, steps, rows, prefill, refused,
	pLookups, pTokens, pEvict, pBytes, pBudget, resident *prometheus.Desc
}

func newEngineCollector(n *Node) engineCollector {
	return engineCollector{n: n, d: engineDescs{
		queue:     prometheus.NewDesc("infermesh_model_queue_depth", "Requests (inputs, for embeddings) waiting in the model's engine on this node.", []string{"model"}, nil),
		batchSize: prometheus.NewDesc("infermesh_engine_batch_size", "Rows per batch the model's dynamic batcher ran (embeddings).", []string{"model"}, nil),
		running:   prometheus.NewDesc("infermesh_engine_batch_running", "Sequences in the model's running decode batch.", []string{"model"}, nil),
		capacity:  prometheus.NewDesc("infermesh_engine_batch_capacity", "Largest decode batch the model's scheduler admits.", []string{"model"}, nil),
		kv:        prometheus.NewDesc("infermesh_engine_kv_cache_bytes", "Memory the model's running batch holds in its key/value cache.", []string{"model"}, nil),
		steps:     prometheus.NewDesc("infermesh_engine_decode_steps_total", "Batched decode runs of the model since it was loaded.", []string{"model"}, nil),
		rows:      prometheus.NewDesc("infermesh_engine_decode_rows_total", "Rows over all batched decode runs (rows / steps is the mean decode batch size).", []string{"model"}, nil),
		prefill:   prometheus.NewDesc("infermesh_engine_prefill_chunks_total", "Prefill runs of the model since it was loaded.", []string{"model"}, nil),
		refused:   prometheus.NewDesc("infermesh_engine_busy_refusals_total", "Requests the model's engine refused because its batch and queue were full.", []string{"model"}, nil),
		pLookups:  prometheus.NewDesc("infermesh_engine_prefix_cache_lookups_total", "Prompts looked up in the model's prefix (KV) cache.", []string{"model"}, nil),
		pTokens:   prometheus.NewDesc("infermesh_engine_prefix_cache_tokens_total", "Prompt tokens by prefix cache result (hit: keys and values reused, miss: computed).", []string{"model", "result"}, nil),
		pEvict:    prometheus.NewDesc("infermesh_engine_prefix_cache_evictions_total", "Prefix cache blocks dropped to stay within the budget.", []string{"model"}, nil),
		pBytes:    prometheus.NewDesc("infermesh_engine_prefix_cache_bytes", "Memory the model's prefix cache holds.", []string{"model"}, nil),
		pBudget:   prometheus.NewDesc("infermesh_engine_prefix_cache_budget_bytes", "The model's prefix cache budget (0: disabled).", []string{"model"}, nil),
		resident:  prometheus.NewDesc("infermesh_model_resident_bytes", "Memory the model holds while loaded on this node: the process's resident growth across its load and its first request here (an estimate).", []string{"model"}, nil),
	}}
}

// engineCollector reads the loaded engines' counters at scrape time.
type engineCollector struct {
	n *Node
	d engineDescs
}

// Describe sends the engine descriptors.
func (e engineCollector) Describe(ch chan<- *prometheus.Desc) {
	d := e.d
	for _, x := range []*prometheus.Desc{d.queue, d.batchSize, d.running, d.capacity, d.kv, d.steps, d.rows, d.prefill, d.refused, d.pLookups, d.pTokens, d.pEvict, d.pBytes, d.pBudget, d.resident} {
		ch <- x
	}
}

// Collect reads every loaded engine that keeps counters.
func (e engineCollector) Collect(ch chan<- prometheus.Metric) {
	if e.n.engines == nil {
		return
	}
	e.n.engines.mu.RLock()
	loaded := make(map[string]engine.Engine, len(e.n.engines.loaded))
	for id, eng := range e.n.engines.loaded {
		loaded[id] = eng
	}
	e.n.engines.mu.RUnlock()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	d := e.d
	for id, b := range e.n.engines.mem.all() {
		if loaded[id] != nil {
			gauge(d.resident, float64(b), id)
		}
	}
	for id, eng := range loaded {
		queued := -1
		if b, ok := eng.(interface{ BatchSizes() onnx.BatchSizes }); ok {
			s := b.BatchSizes()
			buckets := make(map[float64]uint64, len(s.Bounds))
			for i, bound := range s.Bounds {
				buckets[bound] = s.Cumulative[i]
			}
			ch <- prometheus.MustNewConstHistogram(d.batchSize, s.Count, float64(s.Sum), buckets, id)
			queued = s.Queued
		}
		if b, ok := eng.(interface{ BatchStats() engine.BatchStats }); ok {
			s := b.BatchStats()
			queued = max(queued, 0) + s.Queued
			gauge(d.running, float64(s.Running), id)
			gauge(d.capacity, float64(s.MaxBatch), id)
			gauge(d.kv, float64(s.KVBytes), id)
			counter(d.steps, s.Steps, id)
			counter(d.rows, s.StepRows, id)
			counter(d.prefill, s.PrefillChunks, id)
			counter(d.refused, s.Refused, id)
		}
		if b, ok := eng.(interface{ PrefixStats() engine.PrefixStats }); ok {
			s := b.PrefixStats()
			counter(d.pLookups, s.Lookups, id)
			counter(d.pTokens, s.HitTokens, id, "hit")
			counter(d.pTokens, s.MissTokens, id, "miss")
			counter(d.pEvict, s.Evictions, id)
			gauge(d.pBytes, float64(s.Bytes), id)
			gauge(d.pBudget, float64(s.BudgetBytes), id)
		}
		if queued >= 0 {
			gauge(d.queue, float64(queued), id)
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
