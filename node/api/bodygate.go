package api

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/infermesh/infermesh/node/apierr"
)

// BodyLimits bound what slow or large request bodies can cost a node.
type BodyLimits struct {
	// Budget is the most bytes of request bodies all connections together
	// may hold in memory; a request whose declared length does not fit is
	// answered 503 with Retry-After before anything is read, and one
	// without a length that crosses it while reading gets the same.
	// 0 means DefaultBodyBudget.
	Budget int64
	// MinRate is the slowest a body may arrive, in bytes per second, after
	// Grace; a slower sender has its connection's read deadline pass and
	// is answered 408. 0 means DefaultBodyMinRate.
	MinRate int64
	// Grace is how long a body may take before MinRate applies.
	// 0 means DefaultBodyGrace.
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
	if l.MinRate <= 0 {
		l.MinRate = DefaultBodyMinRate
	}
	if l.Grace <= 0 {
		l.Grace = DefaultBodyGrace
	}
	return l
}

// errBodyBudget and errBodySlow are what a gated body's Read returns when
// the node-wide budget is spent or the sender is too slow.
var (
	errBodyBudget = errors.New("request body budget exhausted")
	errBodySlow   = errors.New("request body arrived too slowly")
)

// bodyBudget counts the body bytes held by requests in progress.
type bodyBudget struct {
	mu   sync.Mutex
	used int64
	max  int64
}

func (b *bodyBudget) take(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n > b.max {
		return false
	}
	b.used += n
	return true
}

func (b *bodyBudget) give(n int64) {
	b.mu.Lock()
	b.used -= n
	b.mu.Unlock()
}

// gatedBody wraps a request body: each read moves the connection's read
// deadline to when the bytes read so far plus the next chunk are due at
// the minimum rate, and charges what it reads to the node's budget.
type gatedBody struct {
	body   io.ReadCloser
	rc     *http.ResponseController
	budget *bodyBudget
	lim    BodyLimits
	start  time.Time
	clock  func() time.Time
	read   int64
	// charged is the bytes read and charged beyond the reservation (0
	// while within it).
	charged int64
	// reserved was taken up front from the declared length.
	reserved int64
	// declared is the Content-Length (0: unknown).
	declared int64
	// complete is set once the whole body has been read.
	complete bool
}

const gateChunk = 64 << 10

func (g *gatedBody) Read(p []byte) (int, error) {
	due := g.start.Add(g.lim.Grace + time.Duration(float64(g.read+gateChunk)/float64(g.lim.MinRate)*float64(time.Second)))
	// Setting a deadline fails only on writers that cannot (tests'
	// recorders); the rate then goes unenforced, the budget still holds.
	_ = g.rc.SetReadDeadline(due)
	if g.complete {
		return g.body.Read(p)
	}
	n, err := g.body.Read(p)
	g.read += int64(n)
	// Bytes beyond what the body already holds (its reservation, or what
	// it charged before) are charged now.
	if held := g.held(); g.read > held {
		if !g.budget.take(g.read - held) {
			return n, errBodyBudget
		}
		g.charged = g.read
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
	g.budget.give(g.held())
}

// held is what the body holds in the budget: its reservation, or the
// bytes read beyond it.
func (g *gatedBody) held() int64 { return max(g.charged, g.reserved) }

// gateBodies is middleware that puts every request body under the node's
// BodyLimits. A declared length that cannot fit the budget now is refused
// with 503 and Retry-After before a byte is read.
func (s *Server) gateBodies(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
			next.ServeHTTP(w, r)
			return
		}
		g := &gatedBody{body: r.Body, rc: http.NewResponseController(w), budget: s.bodies, lim: s.bodyLim, start: s.opt.Clock(), clock: s.opt.Clock}
		if r.ContentLength > 0 {
			// A body larger than every route accepts is refused by the
			// route's own limit (413); reserve at most that much.
			want := min(r.ContentLength, MaxImageBody+1)
			if !s.bodies.take(want) {
				s.metrics.bodyRefused.Inc()
				e := apierr.New(http.StatusServiceUnavailable, apierr.TypeServer, apierr.CodeOverloaded, "",
					"The server is holding too many request bodies; retry shortly.")
				e.RetryAfter = 1
				w.Header().Set("Connection", "close")
				apierr.Write(w, e)
				return
			}
			g.reserved, g.declared = want, r.ContentLength
		}
		defer g.release()
		r.Body = g
		next.ServeHTTP(w, r)
	})
}

// bodyReadError maps an error from reading a gated body to the answer.
func bodyReadError(err error) error {
	switch {
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
