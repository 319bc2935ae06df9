package limits

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infermesh/infermesh/consensus"
	"github.com/infermesh/infermesh/node/auth"
)

// viewKeys is the node's KeyStore over the replicated state, as the
// integrator writes it: a map lookup in the local replica.
type viewKeys struct{ n *consensus.Node }

func (v viewKeys) KeyByHash(h [32]byte) (auth.Key, bool) {
	k, ok := v.n.State().KeyByHash(consensus.KeyHash(h))
	if !ok {
		return auth.Key{}, false
	}
	return auth.Key{
		ID: k.ID, Hash: h, Name: k.Name, App: k.App, Admin: k.Admin, Endpoints: k.Endpoints,
		Limits:    auth.Limits{RPM: k.Limits.RPM, DailyQuota: k.Limits.DailyQuota, MonthlyBudgetMicros: k.Limits.MonthlyBudgetMicros},
		ExpiresAt: k.ExpiresAt, Revoked: k.Revoked,
	}, true
}

// admission is the auth + limits middleware the way node/api chains it.
func admission(a *auth.Authenticator, l *Limiter, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		addr, _, _ := net.SplitHostPort(r.RemoteAddr)
		caller, d := a.Authenticate(r, addr, nil)
		if d != nil {
			http.Error(w, d.Message, d.Status)
			return
		}
		tk, d := l.Admit(r.Context(), Request{
			Caller: caller, ClientAddr: addr, Model: "m",
			Class: auth.Classify(r.Method, r.URL.Path), Counted: auth.Counted(r.Method, r.URL.Path),
			Priority: ParsePriority(r.Header.Get(PriorityHeader)),
		})
		if d != nil {
			http.Error(w, d.Message, d.Status)
			return
		}
		next.ServeHTTP(w, r.WithContext(auth.WithCaller(r.Context(), caller)))
		tk.Done(Usage{PromptTokens: 12, CompletionTokens: 3, Status: http.StatusOK})
	})
}

var trivial = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, `{"ok":true}`)
})

type benchSetup struct {
	auth    *auth.Authenticator
	limiter *Limiter
	key     string
}

// setupBench builds a one-node cluster, a key with an rpm, a daily quota
// and a monthly budget (all far from binding) and a priced model, so
// every check on the path runs, leases and usage batches included.
func setupBench(b *testing.B) benchSetup {
	c := cluster(b, 1, nil)
	p := c.Peer("n1")
	plain, h := auth.NewKey()
	cmd, _ := consensus.CreateKey(consensus.KeySpec{
		ID: "key_bench", Hash: consensus.KeyHash(h), Name: "bench", App: "bench",
		Limits: consensus.Limits{RPM: 1 << 40, DailyQuota: 1 << 40, MonthlyBudgetMicros: 1 << 50},
	})
	c.Apply(p, cmd)
	mp, _ := consensus.SetPolicy(consensus.Policy{Models: []consensus.ModelPolicy{{Model: "m", Price: consensus.Price{RequestMicros: 10, InputPerMillionMicros: 1000}}}}, false)
	c.Apply(p, mp)
	a := auth.New(auth.Config{}, viewKeys{p.Node}, nil, prometheus.NewRegistry(), nil)
	l, _ := newLimiter(b, p, Config{ClientRPM: 1 << 40, Prices: NewConsensusPrices(p.Node)}, nil)
	return benchSetup{auth: a, limiter: l, key: plain}
}

// BenchmarkAdmissionHTTP compares, in one run, the throughput of a trivial
// handler over real loopback HTTP with and without auth + limits in front
// of it. Each iteration sends 8 chunks of 250 requests from 8 clients to
// each server, interleaved (off, on, on, off, ...) so load from elsewhere
// on the machine hits both alike; the on/off throughput ratio is the
// number to watch (target ≥ 0.9).
//
//	go test -run '^$' -bench AdmissionHTTP -benchtime 20x ./node/limits
func BenchmarkAdmissionHTTP(b *testing.B) {
	s := setupBench(b)
	off := httptest.NewServer(trivial)
	defer off.Close()
	on := httptest.NewServer(admission(s.auth, s.limiter, trivial))
	defer on.Close()
	const clients, chunk, chunks = 8, 250, 8
	tr := &http.Transport{MaxIdleConnsPerHost: 2 * clients}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	run := func(url string) time.Duration {
		start := time.Now()
		var wg sync.WaitGroup
		for w := 0; w < clients; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < chunk/clients; i++ {
					req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[]}`))
					req.Header.Set("Authorization", "Bearer "+s.key)
					req.Header.Set("Content-Type", "application/json")
					resp, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						b.Errorf("status %d", resp.StatusCode)
						return
					}
				}
			}()
		}
		wg.Wait()
		return time.Since(start)
	}
	for i := 0; i < 4; i++ { // warm both connection pools
		run(off.URL)
		run(on.URL)
	}
	var tOff, tOn time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for c := 0; c < chunks; c++ {
			if c%2 == 0 {
				tOff += run(off.URL)
				tOn += run(on.URL)
			} else {
				tOn += run(on.URL)
				tOff += run(off.URL)
			}
		}
	}
	b.StopTimer()
	n := float64(b.N * chunks * (chunk / clients * clients))
	b.ReportMetric(n/tOff.Seconds(), "off-req/s")
	b.ReportMetric(n/tOn.Seconds(), "on-req/s")
	b.ReportMetric(tOff.Seconds()/tOn.Seconds(), "on/off")
}

// BenchmarkAdmitPath is the cost of the admission path alone, in process:
// Authenticate, Admit and Done per request, from parallel goroutines.
func BenchmarkAdmitPath(b *testing.B) {
	s := setupBench(b)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		r.RemoteAddr = "192.0.2.7:4000"
		r.Header.Set("Authorization", "Bearer "+s.key)
		ctx := context.Background()
		for pb.Next() {
			caller, d := s.auth.Authenticate(r, "192.0.2.7", nil)
			if d != nil {
				b.Error(d)
				return
			}
			tk, d := s.limiter.Admit(ctx, Request{
				Caller: caller, ClientAddr: "192.0.2.7", Model: "m",
				Class: auth.Classify(r.Method, r.URL.Path), Counted: auth.Counted(r.Method, r.URL.Path),
			})
			if d != nil {
				b.Error(d)
				return
			}
			tk.Done(Usage{PromptTokens: 12, CompletionTokens: 3, Status: http.StatusOK})
		}
	})
}
