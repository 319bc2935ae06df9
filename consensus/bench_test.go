package consensus_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infermesh/infermesh/consensus"
	"github.com/infermesh/infermesh/consensus/consensustest"
)

// BenchmarkRaftWrite measures writes on a 3-node in-process cluster (real
// raft, bolt stores with fsync, the shared RPC port): latency p50/p99 at
// concurrency 1, throughput at concurrency 64, and the throughput ratio.
// Each iteration runs a fixed workload, so -benchtime 1x is meaningful.
// "leader" applies on the leader; "follower" applies through a follower,
// which forwards over Connect.
func BenchmarkRaftWrite(b *testing.B) {
	for _, via := range []string{"leader", "follower"} {
		b.Run(via, func(b *testing.B) {
			c := consensustest.New(b, consensustest.Options{})
			c.Start(3)
			c.WaitServers([]string{"n1", "n2", "n3"}, nil)
			p := c.Leader()
			if via == "follower" {
				p = c.Followers()[0]
			}
			cmd := must(consensus.RecordUsage("bench", 0, []consensus.UsageEntry{{App: "app", Model: "m", KeyID: "k", Requests: 1, InputTokens: 12, OutputTokens: 34}}))
			write := func() {
				if _, err := p.Node.Apply(context.Background(), cmd); err != nil {
					b.Fatal(err)
				}
			}
			for range 20 { // warm connections and caches
				write()
			}
			const seqOps, concOps, workers = 200, 2000, 64
			var lat []time.Duration
			var seqTime, concTime time.Duration
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				for range seqOps {
					t := time.Now()
					write()
					lat = append(lat, time.Since(t))
				}
				seqTime += time.Since(start)

				var next atomic.Int64
				var wg sync.WaitGroup
				start = time.Now()
				for range workers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for next.Add(1) <= concOps {
							write()
						}
					}()
				}
				wg.Wait()
				concTime += time.Since(start)
			}
			b.StopTimer()
			slices.Sort(lat)
			pct := func(q float64) float64 {
				return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) / 1000
			}
			c1 := float64(seqOps*b.N) / seqTime.Seconds()
			c64 := float64(concOps*b.N) / concTime.Seconds()
			b.ReportMetric(pct(0.50), "p50-ms")
			b.ReportMetric(pct(0.99), "p99-ms")
			b.ReportMetric(c1, "c1-writes/s")
			b.ReportMetric(c64, "c64-writes/s")
			b.ReportMetric(c64/c1, "c64/c1")
			b.ReportMetric(0, "ns/op")
		})
	}
}
