package node

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/infermesh/infermesh/mesh/forward"
	"github.com/infermesh/infermesh/node/dispatch"
)

// This file traces requests with OpenTelemetry across the hop between the
// entry node and the serving node: an entry span per public request
// (continuing a client's W3C traceparent), a client span per forwarded
// dispatch attempt (whose context travels to the peer in the traceparent
// header of the forward call) and a span for the serving handler
// (continuing the entry span locally, or the forwarded traceparent on the
// peer). Each node has its own TracerProvider; nothing is set globally.
//
// Tracing is off unless the standard variables ask for it:
// OTEL_TRACES_EXPORTER=otlp, or an OTLP endpoint
// (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) with
// OTEL_TRACES_EXPORTER unset. Spans go to the OTLP/HTTP (protobuf)
// exporter, which reads the remaining OTEL_EXPORTER_OTLP_* variables
// (headers, timeout, compression, certificates); OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES name the service (default service.name
// "infermesh", with service.instance.id the node id), and the SDK reads
// OTEL_TRACES_SAMPLER and OTEL_BSP_*.

// tracing is a node's tracer; the zero of tp means tracing is off and
// every wrapper passes through.
type tracing struct {
	tp   *sdktrace.TracerProvider
	tr   trace.Tracer
	prop propagation.TraceContext
}

// tracingEnabled reads OTEL_TRACES_EXPORTER and the OTLP endpoints.
func tracingEnabled() (bool, error) {
	exp := strings.TrimSpace(strings.ToLower(os.Getenv("OTEL_TRACES_EXPORTER")))
	switch exp {
	case "none":
		return false, nil
	case "":
		return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "", nil
	case "otlp":
	default:
		return false, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: infermesh exports traces with otlp (or none)", exp)
	}
	for _, v := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if p := strings.TrimSpace(os.Getenv(v)); p != "" {
			if p != "http/protobuf" {
				return false, fmt.Errorf("%s=%q: infermesh exports OTLP over http/protobuf only", v, p)
			}
			break
		}
	}
	return true, nil
}

// newTracing builds the node's tracer from the OTEL_* environment.
func newTracing(nodeID, version string, log *slog.Logger) (*tracing, error) {
	t := &tracing{}
	on, err := tracingEnabled()
	if err != nil || !on {
		return t, err
	}
	exp, err := otlptracehttp.New(context.Background())
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	res, err := resource.New(context.Background(),
		resource.WithAttributes(
			attribute.String("service.name", "infermesh"),
			attribute.String("service.version", version),
			attribute.String("service.instance.id", nodeID),
		),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES win
	)
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	t.tp = sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	t.tr = t.tp.Tracer("github.com/infermesh/infermesh/node")
	log.Info("tracing on: exporting spans with OTLP/HTTP")
	return t, nil
}

// on reports whether spans are recorded.
func (t *tracing) on() bool { return t != nil && t.tp != nil }

// close flushes the spans still queued and stops the provider.
func (t *tracing) close(context.Context) {
	if !t.on() {
		return
	}
	// The drain's context may already be over; flushing gets its own time.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = t.tp.Shutdown(ctx)
}

// startEntry opens the span of a public request, continuing the client's
// traceparent if it sent one.
func (t *tracing) startEntry(r *http.Request) (*http.Request, trace.Span) {
	if !t.on() {
		return r, nil
	}
	ctx := t.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, span := t.tr.Start(ctx, "infermesh.request", trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("http.request.method", r.Method), attribute.String("url.path", r.URL.Path)))
	return r.WithContext(ctx), span
}

// endSpan records the response status on span and ends it.
func endSpan(span trace.Span, status int) {
	if span == nil {
		return
	}
	span.SetAttributes(attribute.Int("http.response.status_code", status))
	if status >= 500 {
		span.SetStatus(codes.Error, http.StatusText(status))
	}
	span.End()
}

// serve wraps the node's local handler (dispatch's local attempts and
// requests forwarded from peers) in the serving span. A forwarded request
// continues the traceparent the entry node's attempt sent.
func (t *tracing) serve(h http.Handler, nodeID string) http.Handler {
	if !t.on() {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, kind := r.Context(), trace.SpanKindInternal
		if !trace.SpanContextFromContext(ctx).IsValid() {
			ctx, kind = t.prop.Extract(ctx, propagation.HeaderCarrier(r.Header)), trace.SpanKindServer
		}
		ctx, span := t.tr.Start(ctx, "infermesh.serve", trace.WithSpanKind(kind),
			trace.WithAttributes(attribute.String("infermesh.node", nodeID), attribute.String("url.path", r.URL.Path)))
		sw := &timingWriter{ResponseWriter: w}
		defer func() { endSpan(span, sw.code()) }()
		h.ServeHTTP(sw, r.WithContext(ctx))
	})
}

// forwarder wraps dispatch's forwarder: each forwarded attempt runs in a
// client span whose context replaces any traceparent in the forwarded
// headers, so the peer's serving span is its child.
func (t *tracing) forwarder(f dispatch.Forwarder) dispatch.Forwarder {
	if !t.on() {
		return f
	}
	return tracedForwarder{t: t, next: f}
}

type tracedForwarder struct {
	t    *tracing
	next dispatch.Forwarder
}

// Forward starts the attempt's span, which ends with the attempt (dispatch
// cancels the call's context when the attempt is over).
func (f tracedForwarder) Forward(ctx context.Context, addr string, req *forward.Request) (*forward.Stream, error) {
	ctx, span := f.t.tr.Start(ctx, "infermesh.dispatch.forward", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("server.address", addr), attribute.String("infermesh.model", req.Model),
			attribute.String("infermesh.request_id", req.RequestID)))
	out := *req
	out.Header = req.Header.Clone()
	if out.Header == nil {
		out.Header = http.Header{}
	}
	f.t.prop.Inject(ctx, propagation.HeaderCarrier(out.Header))
	s, err := f.next.Forward(ctx, addr, &out)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "forward failed")
		span.End()
		return s, err
	}
	context.AfterFunc(ctx, func() { span.End() })
	return s, nil
}
