package audit

import (
	"bytes"
	"crypto/ed25519"
	"runtime"
	"testing"
	"time"
)

// BenchmarkAuditAppend measures sustained Append throughput through the
// writer (chain, sign, write) under each fsync policy, from parallel
// callers. A full queue is retried so the number is what the writer
// sustains; records/s is the figure to read.
func BenchmarkAuditAppend(b *testing.B) {
	for _, bc := range []struct {
		name string
		sync time.Duration
	}{{"sync=batch", 0}, {"sync=1s", time.Second}, {"sync=os", -1}} {
		b.Run(bc.name, func(b *testing.B) {
			l := openLog(b, b.TempDir(), "bench", Options{SyncInterval: bc.sync})
			r := rec(1)
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					for !l.Append(r) {
						runtime.Gosched()
					}
				}
			})
			flush(b, l)
			el := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/el.Seconds(), "records/s")
			if s := l.Stats(); s.Written != uint64(b.N) {
				b.Fatalf("written %d of %d", s.Written, b.N)
			}
		})
	}
}

// BenchmarkAuditAppendCall measures what a request pays: one Append call
// that does not wait for the write.
func BenchmarkAuditAppendCall(b *testing.B) {
	l := openLog(b, b.TempDir(), "bench", Options{QueueSize: 1 << 20, SyncInterval: -1})
	r := rec(1)
	b.ReportAllocs()
	for b.Loop() {
		l.Append(r)
	}
}

// BenchmarkAuditVerify measures verification speed in records/s.
func BenchmarkAuditVerify(b *testing.B) {
	l := openLog(b, b.TempDir(), "bench", Options{SyncInterval: -1})
	appendN(b, l, 0, 1000)
	data := export(b, l)
	keys := map[string]ed25519.PublicKey{"bench": l.PublicKey()}
	b.ResetTimer()
	for b.Loop() {
		if _, err := Verify(bytes.NewReader(data), keys); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(1000*b.N)/b.Elapsed().Seconds(), "records/s")
}
