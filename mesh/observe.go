package mesh

import (
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
)

// memberlist reports its own metrics only through go-metrics' global sink,
// shared by every memberlist of a process (tests run several nodes in one
// process) and not scoped to a registry. The mesh therefore measures
// gossip itself: probe round trips through memberlist's per-instance
// PingDelegate, and members by state read from the instance at scrape
// time.

// gossipMetrics is the memberlist PingDelegate that times probes, and the
// collector of members by state.
type gossipMetrics struct {
	m   *Mesh
	rtt prometheus.Histogram

	members, health *prometheus.Desc
}

// newGossipMetrics registers infermesh_gossip_probe_rtt_seconds,
// infermesh_gossip_members{state} and infermesh_gossip_health_score on reg
// (nil: none) and returns the PingDelegate for memberlist's config.
func newGossipMetrics(reg prometheus.Registerer, m *Mesh) (memberlist.PingDelegate, error) {
	g := &gossipMetrics{
		m: m,
		rtt: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "infermesh", Subsystem: "gossip", Name: "probe_rtt_seconds",
			Help:    "Round-trip time of successful direct gossip probes (memberlist pings) to peers.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 12),
		}),
		members: prometheus.NewDesc("infermesh_gossip_members",
			"Gossip members by memberlist state (alive, suspect), this node included.", []string{"state"}, nil),
		health: prometheus.NewDesc("infermesh_gossip_health_score",
			"memberlist's awareness score: 0 is healthy, higher means this node misses probes and slows its failure detection.", nil, nil),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{g.rtt, g} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return g, nil
}

// AckPayload sends no payload with probe acks.
func (g *gossipMetrics) AckPayload() []byte { return nil }

// NotifyPingComplete records a probe's round trip.
func (g *gossipMetrics) NotifyPingComplete(_ *memberlist.Node, rtt time.Duration, _ []byte) {
	g.rtt.Observe(rtt.Seconds())
}

// Describe sends the collector's descriptors.
func (g *gossipMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- g.members
	ch <- g.health
}

// Collect reads memberlist's member list now.
func (g *gossipMetrics) Collect(ch chan<- prometheus.Metric) {
	ml := g.m.ml
	if ml == nil {
		return
	}
	var alive, suspect int
	for _, n := range ml.Members() { // dead and left members are not listed
		switch n.State {
		case memberlist.StateAlive:
			alive++
		case memberlist.StateSuspect:
			suspect++
		}
	}
	ch <- prometheus.MustNewConstMetric(g.members, prometheus.GaugeValue, float64(alive), "alive")
	ch <- prometheus.MustNewConstMetric(g.members, prometheus.GaugeValue, float64(suspect), "suspect")
	ch <- prometheus.MustNewConstMetric(g.health, prometheus.GaugeValue, float64(ml.GetHealthScore()))
}
