package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// scaleReq is one request of the scale harness's traffic.
type scaleReq struct {
	start, end time.Time
	entry      string
	kind       string // embeddings, models, quota
	status     int
	code       string
	backend    string
	err        error
}

// traffic sends rate requests per second through random entry nodes that
// are up until ctx ends or d passes, at most conc in flight (a request that
// finds every slot taken is counted as skipped, so the rate stays
// bounded). Mixed: 80 % embeddings on the model the subset serves, 20 %
// model listings. It returns every request.
func (s *scaleRun) traffic(ctx context.Context, rate int, d time.Duration, conc int, rng *rand.Rand) ([]scaleReq, int) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	tick := time.NewTicker(time.Second / time.Duration(max(rate, 1)))
	defer tick.Stop()
	var (
		mu      sync.Mutex
		out     []scaleReq
		wg      sync.WaitGroup
		skipped int
		seq     atomic.Int64
	)
	sem := make(chan struct{}, conc)
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return out, skipped
		case <-tick.C:
		}
		up := s.cl.InState(StateUp)
		if len(up) == 0 {
			continue
		}
		entry := up[rng.IntN(len(up))]
		kind := "embeddings"
		if rng.IntN(5) == 0 {
			kind = "models"
		}
		select {
		case sem <- struct{}{}:
		default:
			skipped++
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			r := s.one(context.WithoutCancel(ctx), entry, kind, "", seq.Add(1))
			mu.Lock()
			out = append(out, r)
			mu.Unlock()
		}()
	}
}

// one sends one request through entry; key "" uses the admin key.
func (s *scaleRun) one(ctx context.Context, entry, kind, key string, i int64) scaleReq {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n := s.cl.Node(entry)
	r := scaleReq{start: time.Now(), entry: entry, kind: kind}
	var res Response
	var err error
	switch kind {
	case "models":
		res, err = s.data.Do(ctx, http.MethodGet, n.BaseURL()+"/v1/models", key, nil)
	default:
		body := map[string]any{"model": s.cfg.Model, "input": []string{"scale request " + strconv.FormatInt(i, 10)}}
		res, err = s.data.Do(ctx, http.MethodPost, n.BaseURL()+"/v1/embeddings", key, body)
	}
	r.end, r.err = time.Now(), err
	r.status, r.code, r.backend = res.Status, res.Code, res.Backend
	return r
}

// Traffic summarises a run of requests.
type Traffic struct {
	// Sent is how many requests were sent; OK how many answered 2xx.
	Sent int `json:"sent"`
	// OK is the 2xx answers.
	OK int `json:"ok"`
	// Errors counts the rest by status (0: no answer) and code.
	Errors map[string]int `json:"errors,omitempty"`
	// Skipped counts requests not sent because every slot was taken.
	Skipped int `json:"skipped,omitempty"`
	// RatePerSec is what was sent per second.
	RatePerSec float64 `json:"rate_per_s"`
	// LatencyMs summarises the answered requests' latency.
	LatencyMs Stats `json:"latency_ms"`
}

func summarise(reqs []scaleReq, skipped int) Traffic {
	t := Traffic{Sent: len(reqs), Skipped: skipped, Errors: map[string]int{}}
	var lat []float64
	var first, last time.Time
	for _, r := range reqs {
		if first.IsZero() || r.start.Before(first) {
			first = r.start
		}
		if r.start.After(last) {
			last = r.start
		}
		if r.status/100 == 2 {
			t.OK++
			lat = append(lat, float64(r.end.Sub(r.start).Microseconds())/1000)
			continue
		}
		t.Errors[strconv.Itoa(r.status)+" "+r.code]++
	}
	if d := last.Sub(first).Seconds(); d > 0 {
		t.RatePerSec = float64(len(reqs)) / d
	}
	t.LatencyMs = statsOf(lat)
	return t
}

// Quota is the outcome of spending one key's daily quota through every
// entry node.
type Quota struct {
	// Limit is the key's daily quota.
	Limit int `json:"limit"`
	// Entries is how many entry nodes the requests went through.
	Entries int `json:"entries"`
	// Admitted counts 2xx answers; it must equal Limit.
	Admitted int `json:"admitted"`
	// Exact is Admitted == Limit.
	Exact bool `json:"exact"`
	// Refused429 counts 429 answers; Premature429 those answered before
	// the limit's last admission (a client refused while quota remained,
	// held by other nodes).
	Refused429 int `json:"refused_429"`
	// Premature429 counts 429s before the last admission.
	Premature429 int `json:"premature_429"`
	// Unavailable503 counts client requests whose last attempt was a 503.
	Unavailable503 int `json:"unavailable_503"`
	// Retried503 counts 503 answers that the client retried.
	Retried503 int `json:"retried_503"`
	// Other counts any other answer or no answer.
	Other map[string]int `json:"other,omitempty"`
	// RefusalCodes counts the 429 and 503 answers by error code.
	RefusalCodes map[string]int `json:"refusal_codes,omitempty"`
	// KeyEverywhereMs is the time from the key's creation being
	// acknowledged to every node listing it. Spending starts only then: a
	// loopback-only node treats a key it does not know yet as its operator
	// (unlimited), so requests sent earlier would not be counted.
	KeyEverywhereMs float64 `json:"key_everywhere_ms"`
	// LastShareSeconds is the time from the admission that left 5 % of the
	// limit to the last admission.
	LastShareSeconds float64 `json:"last_share_s"`
	// LastShareLatencyMs summarises the latency of the last 5 % admitted.
	LastShareLatencyMs Stats `json:"last_share_latency_ms"`
	// Seconds is how long spending took in all.
	Seconds float64 `json:"seconds"`
}

// quota creates a key with a daily quota of limit and spends it with
// workers through random entry nodes among all nodes up, until the limit
// was admitted and then extra more requests were refused, or bound passes.
func (s *scaleRun) quota(ctx context.Context, limit, workers int, bound time.Duration, rng *rand.Rand) (Quota, error) {
	q := Quota{Limit: limit, Other: map[string]int{}, RefusalCodes: map[string]int{}}
	first := s.cl.Node(s.cl.InState(StateUp)[0])
	k, res, err := s.api.CreateKey(ctx, first.BaseURL(), KeySpec{Name: "scale-quota-" + strconv.FormatInt(time.Now().UnixNano(), 36), App: "scale",
		Allow: []string{"models", "embeddings"}, DailyQuota: int64(limit)})
	if err != nil || res.Status/100 != 2 {
		return q, &StatusError{What: "create quota key", Status: res.Status, Code: res.Code}
	}
	created := time.Now()
	if err := s.waitKeyEverywhere(ctx, k.ID, 30*time.Second); err != nil {
		return q, err
	}
	q.KeyEverywhereMs = float64(time.Since(created).Microseconds()) / 1000
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	var (
		mu      sync.Mutex
		reqs    []scaleReq
		ok      int
		after   int // requests answered after the limit was reached
		wg      sync.WaitGroup
		entries = map[string]bool{}
		seq     atomic.Int64
	)
	up := s.cl.InState(StateUp)
	seeds := make([]uint64, workers)
	for i := range seeds {
		seeds[i] = rng.Uint64()
	}
	start := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seeds[w], 1))
			for ctx.Err() == nil {
				// One client request: a 503 (a node that could not secure a
				// share yet) is retried through another random entry node
				// after 500 ms, for up to 10 s; its latency runs from the
				// first attempt.
				asked := time.Now()
				var rq scaleReq
				for {
					entry := up[r.IntN(len(up))]
					rq = s.one(ctx, entry, "quota", k.Key, seq.Add(1))
					if rq.status != http.StatusServiceUnavailable || time.Since(asked) > 10*time.Second || ctx.Err() != nil {
						break
					}
					mu.Lock()
					q.Retried503++
					q.RefusalCodes["503 "+rq.code]++
					mu.Unlock()
					select {
					case <-ctx.Done():
					case <-time.After(500 * time.Millisecond):
					}
				}
				rq.start = asked
				entry := rq.entry
				mu.Lock()
				reqs = append(reqs, rq)
				entries[entry] = true
				if rq.status/100 == 2 {
					ok++
				}
				if ok >= limit {
					after++
				}
				done := after >= 2*workers+limit/10
				mu.Unlock()
				if done {
					cancel()
				}
			}
		}()
	}
	wg.Wait()
	q.Seconds = time.Since(start).Seconds()
	q.Entries = len(entries)
	slices.SortFunc(reqs, func(a, b scaleReq) int { return a.end.Compare(b.end) })
	var admitted []scaleReq
	for _, r := range reqs {
		switch {
		case r.status/100 == 2:
			admitted = append(admitted, r)
		case r.status == http.StatusTooManyRequests:
			q.Refused429++
			q.RefusalCodes["429 "+r.code]++
		case r.status == http.StatusServiceUnavailable:
			q.Unavailable503++
			q.RefusalCodes["503 "+r.code]++
		case r.err != nil && ctx.Err() != nil:
			// cancelled when the run ended: not an answer
		default:
			q.Other[strconv.Itoa(r.status)+" "+r.code]++
		}
	}
	q.Admitted = len(admitted)
	q.Exact = q.Admitted == limit
	if len(admitted) > 0 {
		lastAt := admitted[len(admitted)-1].end
		for _, r := range reqs {
			if r.status == http.StatusTooManyRequests && r.end.Before(lastAt) {
				q.Premature429++
			}
		}
		share := max(limit/20, 1)
		if len(admitted) >= share {
			tail := admitted[len(admitted)-share:]
			from := admitted[max(len(admitted)-share-1, 0)].end
			q.LastShareSeconds = lastAt.Sub(from).Seconds()
			var lat []float64
			for _, r := range tail {
				lat = append(lat, float64(r.end.Sub(r.start).Microseconds())/1000)
			}
			q.LastShareLatencyMs = statsOf(lat)
		}
	}
	return q, nil
}

// waitKeyEverywhere polls every node that is up until each lists key id.
func (s *scaleRun) waitKeyEverywhere(ctx context.Context, id string, bound time.Duration) error {
	deadline := time.Now().Add(bound)
	pending := s.cl.InState(StateUp)
	for len(pending) > 0 {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("key %s not on %d nodes after %s (e.g. %s)", id, len(pending), bound, pending[0])
		}
		var mu sync.Mutex
		var still []string
		var wg sync.WaitGroup
		sem := make(chan struct{}, 16)
		for _, n := range pending {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				keys, _, err := s.api.ListKeys(ctx, s.cl.Node(n).BaseURL())
				found := err == nil && slices.ContainsFunc(keys, func(k KeyInfo) bool { return k.ID == id })
				if !found {
					mu.Lock()
					still = append(still, n)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		pending = still
		if len(pending) > 0 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}
