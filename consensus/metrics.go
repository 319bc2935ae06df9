package consensus

import (
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	applySeconds     *prometheus.HistogramVec
	applyErrors      *prometheus.CounterVec
	leader           prometheus.Gauge
	reconcileChanges *prometheus.CounterVec
	reconcilePasses  prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, n *Node) (*metrics, error) {
	m := &metrics{
		applySeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "infermesh_consensus_apply_seconds",
			Help:    "Time from Apply to the applied result, by path: leader (applied here), forwarded (sent to the leader), served (applied here for a follower).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}, []string{"path"}),
		applyErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infermesh_consensus_apply_errors_total",
			Help: "Apply calls that failed, by reason (no_leader, outcome_unknown, halted, invalid, other). Rejections are not errors.",
		}, []string{"reason"}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "infermesh_consensus_leader",
			Help: "1 while this node is the raft leader.",
		}),
		reconcileChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infermesh_consensus_membership_changes_total",
			Help: "Raft configuration changes made by the reconcile loop, by action.",
		}, []string{"action"}),
		reconcilePasses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "infermesh_consensus_reconcile_passes_total",
			Help: "Completed membership reconcile passes on the leader.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	applied := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "infermesh_consensus_applied_index",
		Help: "Raft index of the last entry applied to this node's state.",
	}, func() float64 { return float64(n.State().AppliedIndex()) })
	raftIn := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name:        "infermesh_consensus_raft_bytes_total",
		Help:        "Bytes raft's transport received or sent (entries, heartbeats, votes, snapshots).",
		ConstLabels: prometheus.Labels{"direction": "in"},
	}, func() float64 { return float64(n.raftBytes.in.Load()) })
	raftOut := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name:        "infermesh_consensus_raft_bytes_total",
		Help:        "Bytes raft's transport received or sent (entries, heartbeats, votes, snapshots).",
		ConstLabels: prometheus.Labels{"direction": "out"},
	}, func() float64 { return float64(n.raftBytes.out.Load()) })
	for _, c := range []prometheus.Collector{m.applySeconds, m.applyErrors, m.leader, m.reconcileChanges, m.reconcilePasses, applied, raftIn, raftOut} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) setLeader(b bool) {
	if b {
		m.leader.Set(1)
	} else {
		m.leader.Set(0)
	}
}
