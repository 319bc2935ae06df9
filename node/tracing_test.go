package node_test

import (
	"compress/gzip"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// exportedSpan is one span an OTLP receiver got, with the node that sent it.
type exportedSpan struct {
	node, service string
	span          *tracepb.Span
}

// otlpReceiver is an OTLP/HTTP trace receiver: it decodes the protobuf
// export requests the nodes' exporters send to /v1/traces.
type otlpReceiver struct {
	mu    sync.Mutex
	spans []exportedSpan
	errs  []error
}

func (o *otlpReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
		o.fail(fmt.Errorf("unexpected %s %s (%s)", r.Method, r.URL.Path, r.Header.Get("Content-Type")))
		http.Error(w, "not an OTLP/HTTP protobuf trace export", http.StatusBadRequest)
		return
	}
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			o.fail(err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	var req coltracepb.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(b, &req)
	}
	if err != nil {
		o.fail(err)
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	o.mu.Lock()
	for _, rs := range req.GetResourceSpans() {
		var nodeID, service string
		for _, kv := range rs.GetResource().GetAttributes() {
			switch kv.GetKey() {
			case "service.instance.id":
				nodeID = kv.GetValue().GetStringValue()
			case "service.name":
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				o.spans = append(o.spans, exportedSpan{node: nodeID, service: service, span: s})
			}
		}
	}
	o.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

func (o *otlpReceiver) fail(err error) {
	o.mu.Lock()
	o.errs = append(o.errs, err)
	o.mu.Unlock()
}

// find returns the span named name of trace traceID exported by node.
func (o *otlpReceiver) find(node, name, traceID string) (exportedSpan, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, s := range o.spans {
		if s.node == node && s.span.GetName() == name && hex.EncodeToString(s.span.GetTraceId()) == traceID {
			return s, true
		}
	}
	return exportedSpan{}, false
}

// TestTracingAcrossTheHop sends a request carrying a client's W3C
// traceparent to a node without the model, which forwards it to the node
// that holds it. Both nodes export to an in-test OTLP/HTTP receiver; the
// spans share the client's trace id and chain entry (b) -> dispatch
// attempt (b) -> serving handler (a), each the child of the one before.
func TestTracingAcrossTheHop(t *testing.T) {
	recv := &otlpReceiver{}
	srv := httptest.NewServer(recv)
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_SERVICE_NAME", "infermesh-test")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")

	a := observedNode(t, "trace-a", nil, nil, "tiny-bert")
	b := observedNode(t, "trace-b", []string{a.GossipAddr()}, nil)
	waitForModel(t, b, bertWire)

	const (
		traceID    = "4bf92f3577b34da6a3ce929d0e0e4736"
		clientSpan = "00f067aa0ba902b7"
	)
	h := http.Header{"Traceparent": {"00-" + traceID + "-" + clientSpan + "-01"}}
	code, backend, out := post(t, b.Addr(), "/v1/embeddings", fmt.Sprintf(`{"model":%q,"input":"hello there"}`, bertWire), h)
	if code != http.StatusOK || backend != a.ID() {
		t.Fatalf("embeddings via %s: %d from %q: %s", b.ID(), code, backend, out)
	}

	var entry, attempt, serve exportedSpan
	// Each is looked up by the client's trace id: found means it
	// continued the client's trace.
	waitFor(t, "the three spans of the client's trace", 15*time.Second, func() bool {
		var ok1, ok2, ok3 bool
		entry, ok1 = recv.find(b.ID(), "infermesh.request", traceID)
		attempt, ok2 = recv.find(b.ID(), "infermesh.dispatch.forward", traceID)
		serve, ok3 = recv.find(a.ID(), "infermesh.serve", traceID)
		return ok1 && ok2 && ok3
	})
	recv.mu.Lock()
	if len(recv.errs) > 0 {
		t.Errorf("receiver errors: %v", recv.errs)
	}
	recv.mu.Unlock()

	id := func(b []byte) string { return hex.EncodeToString(b) }
	for _, s := range []exportedSpan{entry, attempt, serve} {
		if s.service != "infermesh-test" {
			t.Errorf("%s on %s: service.name %q, want OTEL_SERVICE_NAME's", s.span.GetName(), s.node, s.service)
		}
	}
	chain := []struct {
		child, parent exportedSpan
		parentID      string
	}{
		{entry, exportedSpan{}, clientSpan},
		{attempt, entry, ""},
		{serve, attempt, ""},
	}
	for _, c := range chain {
		want := c.parentID
		if want == "" {
			want = id(c.parent.span.GetSpanId())
		}
		if got := id(c.child.span.GetParentSpanId()); got != want {
			t.Errorf("%s on %s: parent %s, want %s", c.child.span.GetName(), c.child.node, got, want)
		}
	}
	kinds := map[string]tracepb.Span_SpanKind{
		"infermesh.request":          tracepb.Span_SPAN_KIND_SERVER,
		"infermesh.dispatch.forward": tracepb.Span_SPAN_KIND_CLIENT,
		"infermesh.serve":            tracepb.Span_SPAN_KIND_SERVER,
	}
	for _, s := range []exportedSpan{entry, attempt, serve} {
		if s.span.GetKind() != kinds[s.span.GetName()] {
			t.Errorf("%s: kind %v, want %v", s.span.GetName(), s.span.GetKind(), kinds[s.span.GetName()])
		}
	}
	// The entry span lasts the whole request, so it encloses the attempt,
	// which encloses the peer's serving span (clocks of one machine). The
	// attempt's span ends when dispatch releases the attempt's context,
	// observed by context.AfterFunc on its own goroutine, so it may end a
	// little after the entry span.
	const slack = 100 * time.Millisecond
	if entry.span.GetStartTimeUnixNano() > attempt.span.GetStartTimeUnixNano() ||
		entry.span.GetEndTimeUnixNano()+uint64(slack) < attempt.span.GetEndTimeUnixNano() {
		t.Errorf("the entry span does not enclose the attempt")
	}
	if attempt.span.GetStartTimeUnixNano() > serve.span.GetStartTimeUnixNano() || attempt.span.GetEndTimeUnixNano() < serve.span.GetEndTimeUnixNano() {
		t.Errorf("the attempt span does not enclose the serving span")
	}
}
