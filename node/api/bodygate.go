package api

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/infermesh/infermesh/node/apierr"
	"github.com/prometheus/client_golang/prometheus"
)

// BodyLimits bound what slow or large request bodies can cost a node.
// Bodies are budgeted as their bytes arrive, after the caller is
// authenticated: a declared Content-Length reserves nothing, so a
// connection that only declares a large body holds nothing.
type BodyLimits struct {
	// Budget is the most bytes of request bodies all connections together
	// may hold in memory; a body that would cross it while reading is
	// answered 503 with Retry-After. 0 means DefaultBodyBudget.
	Budget int64
	// Share is the most of the budget one API key, and separately one
	// client address, may hold at once; a body that would cross its
	// caller's share is answered 429 body_share_exceeded, and other
	// callers keep being served. 0 means a quarter of Budget.
	Share int64
	// MinRate is the slowest a body may arrive, in bytes per second, after
	// Grace; a slower sender has its connection's read deadline pass and
	// is answered 408. 0 means DefaultBodyMinRate.
	MinRate int64
	// Grace is how long a body may take before MinRate applies, and the
	// longest it may go without a byte arriving (measured from its last
	// progress, so a body that stalls late is cut as fast as one that
	// stalls early). 0 means DefaultBodyGrace.
	Grace time.Duration
}

// Defaults of BodyLimits.
const (
	DefaultBodyBudget  = 512 << 20
	DefaultBodyMinRate = 32 << 10
	DefaultBodyGrace   = 10 * time.Second
)

func (l BodyLimits) withDefaults() BodyLimits {
	if l.Budget <= 0 {
		l.Budget = DefaultBodyBudget
	}
	if l.Share <= 0 || l.Share > l.Budget {
		l.Share = l.Budget / 4
	}
	if l.MinRate <= 0 {
		l.MinRate = DefaultBodyMinRate
	}
	if l.Grace <= 0 {
		l.Grace = DefaultBodyGrace
	}
	return l
}

// errBodyBudget and errBodySlow are what a gated body's Read returns when
// the node-wide budget is spent or the sender is too slow; a
// *bodyShareError when its caller's share is.
var (
	errBodyBudget = errors.New("request body budget exhausted")
	errBodySlow   = errors.New("request body arrived too slowly")
)

// bodyShareError is a gated body's Read error when the caller (an API key
// or a client address) holds its whole share of the budget.
type bodyShareError struct {
	holder string // "API key key_…" or "client address …"
	share  int64
}

func (e *bodyShareError) Error() string {
	return fmt.Sprintf("%s holds its share (%d MiB) of the node's request-body budget", e.holder, e.share>>20)
}

// bodyBudget counts the body bytes held by requests in progress, in all
// and by holder (an API key, a client address).
type bodyBudget struct {
	mu    sync.Mutex
	used  int64
	max   int64
	share int64
	by    map[string]int64
}

func newBodyBudget(l BodyLimits) *bodyBudget {
	return &bodyBudget{max: l.Budget, share: l.Share, by: map[string]int64{}}
}

// take charges n bytes to the budget and to each holder, or nothing and
// the error that refused it.
func (b *bodyBudget) take(n int64, holders []string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n > b.max {
		return errBodyBudget
	}
	for _, h := range holders {
		if b.by[h]+n > b.share {
			return &bodyShareError{holder: h, share: b.share}
		}
	}
	b.used += n
	for _, h := range holders {
		b.by[h] += n
	}
	return nil
}

func (b *bodyBudget) give(n int64, holders []string) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	for _, h := range holders {
		if b.by[h] -= n; b.by[h] <= 0 {
			delete(b.by, h)
		}
	}
	b.mu.Unlock()
}

// gatedBody wraps a request body: each read moves the connection's read
// deadline to the earlier of when the bytes read so far plus the next chunk
// are due at the minimum rate and Grace after the last byte arrived, and
// charges what it reads to the node's budget and its holders' shares.
type gatedBody struct {
	body    io.ReadCloser
	rc      *http.ResponseController
	budget  *bodyBudget
	holders []string
	lim     BodyLimits
	start   time.Time
	last    time.Time // when the last bytes arrived
	clock   func() time.Time
	read    int64
	// charged is the bytes read and charged to the budget.
	charged int64
	// declared is the Content-Length (0: unknown).
	declared int64
	// complete is set once the whole body has been read.
	complete bool
	// refused counts bodies the budget or a share refused.
	refused prometheus.Counter
}

const gateChunk = 64 << 10

func (g *gatedBody) Read(p []byte) (int, error) {
	if g.complete {
		return g.body.Read(p)
	}
	due := g.start.Add(g.lim.Grace + time.Duration(float64(g.read+gateChunk)/float64(g.lim.MinRate)*float64(time.Second)))
	if stall := g.last.Add(g.lim.Grace); stall.Before(due) {
		due = stall
	}
	// Setting a deadline fails only on writers that cannot (tests'
	// recorders); the rate then goes unenforced, the budget still holds.
	_ = g.rc.SetReadDeadline(due)
	n, err := g.body.Read(p)
	if n > 0 {
		g.read += int64(n)
		g.last = g.clock()
		if terr := g.budget.take(int64(n), g.holders); terr != nil {
			// No bytes with the error: io.ReadFull drops an error that
			// comes with the bytes that fill its buffer.
			g.refused.Inc()
			return 0, terr
		}
		g.charged += int64(n)
	}
	if err != nil && !errors.Is(err, io.EOF) && !g.clock().Before(due) {
		return n, fmt.Errorf("%w: %v", errBodySlow, err)
	}
	if errors.Is(err, io.EOF) || g.declared > 0 && g.read >= g.declared {
		// The whole body is in: lift the deadline, or the server's
		// background read would hit it and cancel a long response.
		g.complete = true
		_ = g.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

func (g *gatedBody) Close() error { return g.body.Close() }

// release returns what the body holds in the budget. A body not read to
// its end keeps its deadline, so the server's discard of the rest after
// the handler fails fast for a sender that stalled; the server sets new
// deadlines before the connection's next request.
func (g *gatedBody) release() {
	g.budget.give(g.charged, g.holders)
}

// bodyHolders are who a request's body bytes are charged to: the API key
// the caller authenticated with (when it used one) and its client address.
func (s *Server) bodyHolders(r *http.Request) []string {
	var hs []string
	if s.opt.Admission != nil {
		if id := s.opt.Admission.CallerKeyID(r.Context()); id != "" {
			hs = append(hs, "API key "+id)
		}
	}
	if a := ClientAddr(r.Context()); a != "" {
		hs = append(hs, "client address "+a)
	}
	return hs
}

// gateBodies is middleware that puts every request body under the node's
// BodyLimits. It runs after authentication, so the holders it charges are
// known; nothing is reserved before bytes arrive.
func (s *Server) gateBodies(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
			next.ServeHTTP(w, r)
			return
		}
		now := s.opt.Clock()
		g := &gatedBody{body: r.Body, rc: http.NewResponseController(w), budget: s.bodies, holders: s.bodyHolders(r),
			lim: s.bodyLim, start: now, last: now, clock: s.opt.Clock, declared: max(r.ContentLength, 0),
			refused: s.metrics.bodyRefused}
		defer g.release()
		r.Body = g
		next.ServeHTTP(w, r)
	})
}

// bodyReadError maps an error from reading a gated body to the answer.
func bodyReadError(err error) error {
	var share *bodyShareError
	switch {
	case errors.As(err, &share):
		e := apierr.New(http.StatusTooManyRequests, apierr.TypeRateLimit, apierr.CodeBodyShare, "",
			"The "+share.Error()+"; retry when its other requests have been read.")
		e.RetryAfter = 1
		return e
	case errors.Is(err, errBodyBudget):
		e := apierr.New(http.StatusServiceUnavailable, apierr.TypeServer, apierr.CodeOverloaded, "",
			"The server is holding too many request bodies; retry shortly.")
		e.RetryAfter = 1
		return e
	case errors.Is(err, errBodySlow):
		return apierr.New(http.StatusRequestTimeout, apierr.TypeInvalidRequest, apierr.CodeRequestTimeout, "",
			"The request body arrived too slowly.")
	}
	return apierr.BadRequest(apierr.CodeInvalidJSON, "", "Could not read the request body.")
}
