package auth

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	public, local, forwarded, key prometheus.Counter
	missing, invalid, inactive    prometheus.Counter
	forbidden, throttled          prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, t *throttle) *metrics {
	decisions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "infermesh_auth_decisions_total",
		Help: "Authentication decisions by result.",
	}, []string{"result"})
	tracked := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "infermesh_auth_tracked_clients",
		Help: "Client addresses the wrong-key throttle remembers.",
	}, func() float64 { return float64(t.size()) })
	if reg != nil {
		reg.MustRegister(decisions, tracked)
	}
	return &metrics{
		public:    decisions.WithLabelValues("public"),
		local:     decisions.WithLabelValues("local"),
		forwarded: decisions.WithLabelValues("forwarded"),
		key:       decisions.WithLabelValues("key"),
		missing:   decisions.WithLabelValues("missing_key"),
		invalid:   decisions.WithLabelValues("invalid_key"),
		inactive:  decisions.WithLabelValues("inactive_key"),
		forbidden: decisions.WithLabelValues("forbidden"),
		throttled: decisions.WithLabelValues("throttled"),
	}
}
