package mesh

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the mesh's Prometheus series, registered on the node's own
// registry.
type metrics struct {
	received  *prometheus.CounterVec
	published prometheus.Counter
	ejections prometheus.Counter
	joins     *prometheus.CounterVec
	events    *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, members func() float64, bytes *gossipBytes) (*metrics, error) {
	m := &metrics{
		received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "infermesh", Subsystem: "mesh", Name: "records_received_total",
			Help: "Node records received through gossip or push-pull, by result (accepted, stale, invalid).",
		}, []string{"result"}),
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "infermesh", Subsystem: "mesh", Name: "records_published_total",
			Help: "Versions of this node's record published.",
		}),
		ejections: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "infermesh", Subsystem: "mesh", Name: "ejections_total",
			Help: "Peers ejected from routing after a refused connection.",
		}),
		joins: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "infermesh", Subsystem: "mesh", Name: "join_attempts_total",
			Help: "Attempts to join the mesh through the configured join addresses, by result.",
		}, []string{"result"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "infermesh", Subsystem: "mesh", Name: "events_total",
			Help: "Membership and record events, by type.",
		}, []string{"type"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{
		m.received, m.published, m.ejections, m.joins, m.events,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "infermesh", Subsystem: "mesh", Name: "members",
			Help: "Nodes memberlist currently reports alive, this one included.",
		}, members),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "infermesh", Subsystem: "mesh", Name: "gossip_bytes_total",
			Help:        "Bytes the gossip transport received or sent (UDP payloads and TCP streams, as on the wire).",
			ConstLabels: prometheus.Labels{"direction": "in"},
		}, func() float64 { return float64(bytes.in.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "infermesh", Subsystem: "mesh", Name: "gossip_bytes_total",
			Help:        "Bytes the gossip transport received or sent (UDP payloads and TCP streams, as on the wire).",
			ConstLabels: prometheus.Labels{"direction": "out"},
		}, func() float64 { return float64(bytes.out.Load()) }),
	} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
