package dispatch

import (
	"fmt"
	"net/http"

	"github.com/infermesh/infermesh/node/apierr"
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	outcomes      *prometheus.CounterVec
	retries       prometheus.Counter
	attempts      prometheus.Histogram
	localRejected prometheus.Counter
	inFlight      prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "infermesh", Subsystem: "dispatch", Name: "requests_total",
			Help: "Dispatched requests by outcome (local, forwarded, saturated, failed).",
		}, []string{"outcome"}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "infermesh", Subsystem: "dispatch", Name: "retries_total",
			Help: "Attempts that failed over to the next candidate.",
		}),
		attempts: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "infermesh", Subsystem: "dispatch", Name: "attempts",
			Help:    "Candidates tried per request.",
			Buckets: []float64{1, 2, 3, 4, 6, 8},
		}),
		localRejected: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "infermesh", Subsystem: "dispatch", Name: "local_rejected_total",
			Help: "Requests this node refused at its in-flight cap.",
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "infermesh", Subsystem: "dispatch", Name: "in_flight",
			Help: "Requests this node serves now (its own and forwarded in).",
		}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.outcomes, m.retries, m.attempts, m.localRejected, m.inFlight} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("dispatch: metrics: %w", err)
			}
		}
	}
	return m, nil
}

// writeJSONError is the default ErrorWriter: the OpenAI error shape.
func writeJSONError(w http.ResponseWriter, _ *http.Request, status int, message string) {
	typ := apierr.TypeServer
	if status == http.StatusServiceUnavailable {
		typ = apierr.TypeServiceUnavailable
	}
	apierr.Write(w, apierr.New(status, typ, "", "", message))
}
