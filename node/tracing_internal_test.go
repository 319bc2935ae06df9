package node

import "testing"

// TestTracingIsOffByDefault checks which OTEL_* settings turn tracing on.
func TestTracingIsOffByDefault(t *testing.T) {
	for _, c := range []struct {
		exporter, endpoint, tracesEndpoint, protocol string
		on, bad                                      bool
	}{
		{},
		{exporter: "none", endpoint: "http://127.0.0.1:4318"},
		{endpoint: "http://127.0.0.1:4318", on: true},
		{tracesEndpoint: "http://127.0.0.1:4318/v1/traces", on: true},
		{exporter: "otlp", on: true},
		{exporter: "OTLP", protocol: "http/protobuf", on: true},
		{exporter: "otlp", protocol: "grpc", bad: true},
		{exporter: "zipkin", bad: true},
	} {
		t.Setenv("OTEL_TRACES_EXPORTER", c.exporter)
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", c.endpoint)
		t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", c.tracesEndpoint)
		t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", c.protocol)
		t.Setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "")
		on, err := tracingEnabled()
		if on != c.on || (err != nil) != c.bad {
			t.Errorf("%+v: on %t, err %v", c, on, err)
		}
	}
}
