package limits

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	decisions     *prometheus.CounterVec
	admitted      prometheus.Counter
	exempt        prometheus.Counter
	leaseCommands *prometheus.CounterVec
	usageBatches  *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, l *Limiter) *metrics {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infermesh_limits_decisions_total",
			Help: "Admission decisions on counted requests by result (admitted, exempt, or the refusal code).",
		}, []string{"result"}),
		leaseCommands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infermesh_limits_lease_commands_total",
			Help: "Lease commands sent to the cluster by kind (acquire, settle) and result.",
		}, []string{"command", "result"}),
		usageBatches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infermesh_limits_usage_batches_total",
			Help: "Usage batches sent to the cluster by result.",
		}, []string{"result"}),
	}
	accounts := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "infermesh_limits_lease_accounts",
		Help: "Keys and kinds this node keeps a lease account for.",
	}, func() float64 {
		l.mu.RLock()
		defer l.mu.RUnlock()
		return float64(len(l.accounts))
	})
	buckets := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "infermesh_limits_rate_buckets",
		Help: "Rate-limit token buckets held (keys and client addresses).",
	}, func() float64 { return float64(l.keyBuckets.size() + l.clientBuckets.size()) })
	if reg != nil {
		reg.MustRegister(m.decisions, m.leaseCommands, m.usageBatches, accounts, buckets)
	}
	m.admitted = m.decisions.WithLabelValues("admitted")
	m.exempt = m.decisions.WithLabelValues("exempt")
	return m
}

func (m *metrics) leaseCommand(settle bool, err error) {
	cmd, res := "acquire", "ok"
	if settle {
		cmd = "settle"
	}
	if err != nil {
		res = "error"
	}
	m.leaseCommands.WithLabelValues(cmd, res).Inc()
}
