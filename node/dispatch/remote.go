package dispatch

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/infermesh/infermesh/mesh/forward"
	"github.com/infermesh/infermesh/mesh/route"
)

// clientGoneGrace is how long a forwarded call outlives its client.
const clientGoneGrace = 2 * time.Second

// tryRemote forwards the request to peer p. It reports not done, with the
// reason, when the peer failed or answered 502/503/504 (and this is not the
// last candidate) before anything was written to the client; once the head
// is written the attempt is done whatever happens.
func (d *Dispatcher) tryRemote(w http.ResponseWriter, r *http.Request, f Facts, body []byte, p *route.Peer, last bool) (Outcome, bool) {
	c := d.outboundCounter(p.ID)
	c.Add(1)
	defer c.Add(-1)
	req := &forward.Request{
		Method:    r.Method,
		Path:      r.URL.RequestURI(),
		Host:      r.Host,
		Header:    d.requestHeader(r.Header),
		Body:      body,
		Caller:    f.Caller,
		RequestID: f.RequestID,
		Model:     f.Model,
		Unary:     f.OnePiece,
	}
	// Until the head arrives, watch the peer: one that gossip stops listing
	// as routable (partitioned, paused, dead) abandons the attempt so the
	// request moves on while nothing has reached the client. Without this,
	// a request on an established connection to a partitioned peer waited
	// for the client's timeout (found by the chaos suite).
	//
	// A client that goes away cancels the call only after clientGoneGrace:
	// a streaming client (the OpenAI SDKs) closes the connection as soon as
	// it reads [DONE], just before the peer's trailer with the usage
	// arrives, and that answer was complete and must be counted.
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	defer cancel()
	stopGrace := context.AfterFunc(r.Context(), func() {
		t := time.AfterFunc(clientGoneGrace, cancel)
		context.AfterFunc(ctx, func() { t.Stop() })
	})
	defer stopGrace()
	a := &attempt{cancel: cancel}
	d.watch.start(p.ID, a)
	s, err := d.fwd.Forward(ctx, p.RPCAddr, req)
	var head forward.Head
	if err == nil {
		head, err = s.Head()
	}
	d.watch.stop(p.ID, a)
	if err != nil {
		if s != nil {
			s.Close()
		}
		return d.failedBeforeHead(w, r, f, p, a, err, "peer failed before responding")
	}
	defer s.Close()
	if !last && retryableStatus(head.Status) {
		return Outcome{Err: fmt.Errorf("%w: %d from %s", errUnavailable, head.Status, p.ID)}, false
	}
	dst := w.Header()
	for k, v := range head.Header {
		dst[k] = v
	}
	dst.Set(BackendHeader, p.ID)
	w.WriteHeader(head.Status)
	o := Outcome{Backend: p.ID, Status: head.Status, Forwarded: true}
	var rc *http.ResponseController // made at the first flush: most answers never flush
	flushClient := func() {
		if rc == nil {
			rc = http.NewResponseController(w)
		}
		_ = rc.Flush()
	}
	if head.Flush {
		flushClient()
	}
	for {
		chunk, flush, err := s.Next()
		if err == io.EOF {
			t := s.Trailer()
			o.Usage = t.Usage
			if t.Err != "" {
				o.Err = fmt.Errorf("%w: %s failed mid-response: %s", ErrIncomplete, p.ID, t.Err)
			}
			return o, true
		}
		if err != nil {
			o.Err = fmt.Errorf("%w: stream from %s broke: %w", ErrIncomplete, p.ID, err)
			return o, true
		}
		if len(chunk) > 0 {
			if _, err := w.Write(chunk); err != nil {
				o.Err = fmt.Errorf("%w: client write: %w", ErrIncomplete, err)
				return o, true
			}
		}
		// Flush where the serving handler flushed (server-sent events), and
		// let the HTTP server buffer everything else.
		if flush {
			flushClient()
		}
	}
}

// requestHeader returns the headers to forward, without the dropped ones.
func (d *Dispatcher) requestHeader(h http.Header) http.Header {
	for k := range d.drop {
		if _, ok := h[k]; ok {
			out := h.Clone()
			for k := range d.drop {
				delete(out, k)
			}
			return out
		}
	}
	return h
}

// failedBeforeHead ends an attempt whose peer failed before its answer's
// head (a forward or a relay): a peer that left routing meanwhile or is
// unreachable is ejected, and the attempt moves on to the next candidate
// unless the client is gone or the error is final, in which case a 502 is
// written (logged with msg).
func (d *Dispatcher) failedBeforeHead(w http.ResponseWriter, r *http.Request, f Facts, p *route.Peer, a *attempt, err error, msg string) (Outcome, bool) {
	if a.lost.Load() && r.Context().Err() == nil {
		d.peers.Eject(p.ID)
		return Outcome{Err: fmt.Errorf("%w: %s left routing before answering", errUnavailable, p.ID)}, false
	}
	switch {
	case forward.IsRefused(err):
		d.peers.Refused(p.ID)
	case forward.IsUnreachable(err):
		d.peers.Eject(p.ID)
	}
	if cerr := r.Context().Err(); cerr != nil {
		return Outcome{Err: cerr}, false
	}
	if forward.Retryable(err) {
		return Outcome{Err: err}, false
	}
	d.log.Warn(msg, "peer", p.ID, "request_id", f.RequestID, "err", err)
	d.cfg.WriteError(w, r, http.StatusBadGateway, "the serving node failed")
	return Outcome{Status: http.StatusBadGateway, Err: err}, true
}
