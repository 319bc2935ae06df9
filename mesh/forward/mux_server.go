package forward

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	forwardv1 "github.com/infermesh/infermesh/proto/gen/infermesh/forward/v1"
)

// Multiplex serves one ForwardService.Multiplex stream: many forwarded
// requests from one peer, each replayed as Forward replays one.
func (sv *service) Multiplex(ctx context.Context, bs *connect.BidiStream[forwardv1.MultiplexRequest, forwardv1.MultiplexResponse]) error {
	return sv.s.multiplex(ctx, bs)
}

// muxServerStream is the serving side of one Multiplex stream.
type muxServerStream struct {
	s     *Server
	bs    *connect.BidiStream[forwardv1.MultiplexRequest, forwardv1.MultiplexResponse]
	gate  *flushGate
	mac   *frameMAC // nil under mutual TLS
	calls sync.WaitGroup

	sendMu sync.Mutex
	sendOK bool // false once a send failed: the stream is gone

	mu      sync.Mutex
	cancels map[uint64]context.CancelFunc
}

// multiplex authenticates the stream's open (the verifier interceptor
// checked its signature on Receive), agrees the frame key, then serves
// calls until the caller closes the stream or it breaks. It returns only
// when every call it started has finished.
func (s *Server) multiplex(ctx context.Context, bs *connect.BidiStream[forwardv1.MultiplexRequest, forwardv1.MultiplexResponse]) error {
	first, err := bs.Receive()
	if err != nil {
		return err
	}
	open := first.GetOpen()
	if open == nil {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("forward: a multiplex stream starts with an open frame"))
	}
	if s.Draining() {
		s.met.calls.WithLabelValues("draining").Inc()
		return drainingError()
	}
	ms := &muxServerStream{s: s, bs: bs, gate: flushGateFrom(ctx), sendOK: true, cancels: map[uint64]context.CancelFunc{}}
	priv, err := newMuxKey()
	if err != nil {
		return connect.NewError(connect.CodeInternal, err)
	}
	pub := priv.PublicKey().Bytes()
	tlsPeer, _ := ctx.Value(tlsPeerKey{}).(bool)
	if !tlsPeer {
		if ms.mac, err = newFrameMAC(priv, open.GetPublicKey(), open.GetPublicKey(), pub); err != nil {
			return connect.NewError(connect.CodeInvalidArgument, err)
		}
	}
	ready := &forwardv1.MultiplexResponse{Frame: &forwardv1.MultiplexResponse_Ready{Ready: &forwardv1.MultiplexReady{PublicKey: pub, FrameMacs: !tlsPeer}}}
	if err := ms.send(ready, true); err != nil {
		return err
	}
	s.met.muxStreams.Inc()
	defer s.met.muxStreams.Dec()
	// The calls' contexts end with the stream's: a caller that goes away
	// cancels everything it asked for.
	streamCtx, cancelAll := context.WithCancel(ctx)
	defer func() {
		cancelAll()
		ms.calls.Wait()
	}()
	var last uint64
	for {
		msg, err := bs.Receive()
		if err != nil {
			return nil // the caller closed the stream, or it broke
		}
		if b := msg.GetBatch(); b != nil {
			for _, f := range b.GetFrames() {
				if f.GetBatch() != nil {
					return connect.NewError(connect.CodeInvalidArgument, errors.New("forward: nested multiplex batch"))
				}
				if err := ms.handle(streamCtx, f, &last); err != nil {
					return err
				}
			}
			continue
		}
		if err := ms.handle(streamCtx, msg, &last); err != nil {
			return err
		}
	}
}

// handle checks and acts on one call or cancel frame; an error ends the
// stream. last is the greatest call id seen.
func (ms *muxServerStream) handle(ctx context.Context, msg *forwardv1.MultiplexRequest, last *uint64) error {
	s := ms.s
	switch f := msg.GetFrame().(type) {
	case *forwardv1.MultiplexRequest_Call:
		c := f.Call
		if c.GetId() <= *last {
			s.met.calls.WithLabelValues("replay").Inc()
			return connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("forward: multiplex call id %d not above %d (replayed frame)", c.GetId(), *last))
		}
		if ms.mac != nil && !ms.mac.check(c.GetMac(), frameCall, c.GetId(), c.GetRequest()) {
			s.met.calls.WithLabelValues("bad_mac").Inc()
			return connect.NewError(connect.CodeUnauthenticated, errors.New("forward: multiplex frame with a wrong MAC"))
		}
		*last = c.GetId()
		ms.start(ctx, c)
	case *forwardv1.MultiplexRequest_Cancel:
		c := f.Cancel
		if ms.mac != nil && !ms.mac.check(c.GetMac(), frameCancel, c.GetId(), nil) {
			s.met.calls.WithLabelValues("bad_mac").Inc()
			return connect.NewError(connect.CodeUnauthenticated, errors.New("forward: multiplex frame with a wrong MAC"))
		}
		ms.mu.Lock()
		cancel := ms.cancels[c.GetId()]
		ms.mu.Unlock()
		if cancel != nil {
			cancel()
		}
	default:
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("forward: unexpected multiplex frame %T", f))
	}
	return nil
}

// start replays one call on its own goroutine.
func (ms *muxServerStream) start(ctx context.Context, c *forwardv1.MultiplexCall) {
	id := c.GetId()
	var cancel context.CancelFunc
	if t := c.GetTimeoutMs(); t > 0 {
		ctx, cancel = context.WithTimeout(ctx, time.Duration(t)*time.Millisecond)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	ms.mu.Lock()
	ms.cancels[id] = cancel
	ms.mu.Unlock()
	ms.calls.Add(1)
	go func() {
		defer ms.calls.Done()
		defer func() {
			ms.mu.Lock()
			delete(ms.cancels, id)
			ms.mu.Unlock()
			cancel()
		}()
		ms.serve(ctx, id, c.GetRequest(), c.GetUnary())
	}()
}

// serve replays one call and sends its frames, or one error frame when it
// failed before its head.
func (ms *muxServerStream) serve(ctx context.Context, id uint64, raw []byte, unary bool) {
	var err error
	msg := new(forwardv1.ForwardRequest)
	if uerr := proto.Unmarshal(raw, msg); uerr != nil {
		ms.s.met.calls.WithLabelValues("bad_request").Inc()
		err = connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("forward: bad request: %w", uerr))
	}
	var w *streamWriter
	if err == nil {
		w = newStreamWriter(func(m *forwardv1.ForwardResponse) error {
			return ms.send(&forwardv1.MultiplexResponse{Id: id, Frame: &forwardv1.MultiplexResponse_Response{Response: m}}, false)
		}, ms.flush, ms.s.cfg.ChunkSize)
		w.noFlush = unary
		err = ms.s.replay(ctx, msg, w)
	}
	if err != nil && (w == nil || !w.sent()) {
		ce := new(connect.Error)
		if !errors.As(err, &ce) {
			ce = connect.NewError(connect.CodeUnknown, err)
		}
		_ = ms.send(&forwardv1.MultiplexResponse{Id: id, Frame: &forwardv1.MultiplexResponse_Error{Error: &forwardv1.MultiplexError{
			Code: ce.Code().String(), Message: ce.Message(), Refusal: ce.Meta().Get(RefusalHeader),
		}}}, true)
		return
	}
	_ = ms.flush()
}

// send sends one frame, and flushes the stream with flush set. After a
// failed send every later one fails at once.
func (ms *muxServerStream) send(m *forwardv1.MultiplexResponse, flush bool) error {
	ms.sendMu.Lock()
	defer ms.sendMu.Unlock()
	if !ms.sendOK {
		return errMuxGone
	}
	err := ms.bs.Send(m)
	if err == nil && flush {
		err = ms.gate.flushNow()
	}
	if err != nil {
		ms.sendOK = false
	}
	return err
}

// flush pushes the frames sent so far to the wire.
func (ms *muxServerStream) flush() error {
	ms.sendMu.Lock()
	defer ms.sendMu.Unlock()
	if !ms.sendOK {
		return errMuxGone
	}
	if err := ms.gate.flushNow(); err != nil {
		ms.sendOK = false
		return err
	}
	return nil
}

// errMuxGone fails sends on a Multiplex stream that broke.
var errMuxGone = errors.New("forward: multiplex stream gone")

// drainingError is the refusal of a draining node. A new error each time:
// a *connect.Error carries mutable metadata.
func drainingError() *connect.Error {
	err := connect.NewError(connect.CodeUnavailable, errors.New("node is draining"))
	err.Meta().Set(RefusalHeader, "draining")
	return err
}
