package forward

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	forwardv1 "github.com/infermesh/infermesh/proto/gen/infermesh/forward/v1"
)

// The multiplexed path: one long-lived Multiplex stream per peer carries
// the small forwarded requests (most of them), each as a MultiplexCall
// frame, with their answers coming back as frames tagged with the call's
// id. It saves what one Connect call per request costs on both ends (an
// HTTP exchange, headers, a signature over the body, a handler goroutine
// per connection). The stream is opened in the background on first use
// and reopened with backoff when it breaks; until it is ready, and for
// bodies over ClientConfig.MuxMaxBody, requests take a call of their own,
// so the stream is an optimisation that never decides an outcome.

const (
	// muxOpenTimeout bounds opening a stream (dial, TLS, the peer's Ready).
	muxOpenTimeout = 5 * time.Second
	// muxBackoffMin and muxBackoffMax bound the wait before reopening a
	// stream whose open failed.
	muxBackoffMin = 100 * time.Millisecond
	muxBackoffMax = 10 * time.Second
	// muxUnsupportedRetry is how long a peer that does not know Multiplex
	// (an older version) is not asked again.
	muxUnsupportedRetry = time.Minute
	// muxSendStall is how long a write may be stuck before a caller that
	// gives up ends the stream.
	muxSendStall = time.Second
	// muxCallQueue is how many frames of one call wait for its reader; a
	// reader slower than that holds up the stream's other calls, as a full
	// TCP window would.
	muxCallQueue = 32
)

// muxPeers holds the Multiplex stream of every peer.
type muxPeers struct {
	c *Client

	mu     sync.RWMutex
	peers  map[string]*muxPeer
	closed bool
}

// muxPeer is one peer's stream state.
type muxPeer struct {
	addr string
	conn atomic.Pointer[muxConn] // ready stream, or nil

	mu       sync.Mutex // guards the fields below
	opening  bool
	failures int
	retryAt  time.Time
}

func newMuxPeers(c *Client) *muxPeers {
	return &muxPeers{c: c, peers: map[string]*muxPeer{}}
}

// get returns the ready stream to addr, or nil (then starting to open one
// unless an open runs or the last failure's backoff has not passed).
func (mp *muxPeers) get(addr string) *muxConn {
	mp.mu.RLock()
	p := mp.peers[addr]
	closed := mp.closed
	mp.mu.RUnlock()
	if p != nil {
		if mc := p.conn.Load(); mc != nil {
			return mc
		}
	}
	if closed {
		return nil
	}
	if p == nil {
		mp.mu.Lock()
		if p = mp.peers[addr]; p == nil {
			p = &muxPeer{addr: addr}
			mp.peers[addr] = p
		}
		mp.mu.Unlock()
	}
	p.mu.Lock()
	if !p.opening && !time.Now().Before(p.retryAt) {
		p.opening = true
		go mp.open(p)
	}
	p.mu.Unlock()
	return nil
}

// open opens p's stream and records the result.
func (mp *muxPeers) open(p *muxPeer) {
	mc, err := mp.dial(p)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.opening = false
	mp.mu.RLock()
	closed := mp.closed
	mp.mu.RUnlock()
	if err == nil && closed {
		mc.cancel()
		return
	}
	if err != nil {
		p.failures++
		wait := min(muxBackoffMin<<min(p.failures-1, 16), muxBackoffMax)
		result := "error"
		if connect.CodeOf(err) == connect.CodeUnimplemented {
			wait, result = muxUnsupportedRetry, "unsupported"
		}
		p.retryAt = time.Now().Add(wait)
		mp.c.met.muxOpens.WithLabelValues(result).Inc()
		mp.c.log.Debug("multiplex stream open failed", "peer", p.addr, "err", err, "retry_in", wait)
		return
	}
	p.failures = 0
	p.conn.Store(mc)
	mp.c.met.muxOpens.WithLabelValues("ok").Inc()
	go mc.readLoop(p)
}

// dial opens a stream and waits for the peer's Ready.
func (mp *muxPeers) dial(p *muxPeer) (*muxConn, error) {
	ctx, cancel := context.WithCancel(context.Background())
	bs := mp.c.muxRelay.peer(p.addr).Multiplex(ctx)
	priv, err := newMuxKey()
	if err != nil {
		cancel()
		return nil, err
	}
	pub := priv.PublicKey().Bytes()
	t := time.AfterFunc(muxOpenTimeout, cancel)
	defer t.Stop()
	// An error of Send (io.EOF: the peer answered already) shows in Receive.
	_ = bs.Send(&forwardv1.MultiplexRequest{Frame: &forwardv1.MultiplexRequest_Open{Open: &forwardv1.MultiplexOpen{PublicKey: pub}}})
	msg, err := bs.Receive()
	if err == nil && msg.GetReady() == nil {
		err = fmt.Errorf("%w: first multiplex frame is not ready", ErrProtocol)
	}
	var mac *frameMAC
	if err == nil && msg.GetReady().GetFrameMacs() {
		peerPub := msg.GetReady().GetPublicKey()
		mac, err = newFrameMAC(priv, peerPub, pub, peerPub)
	}
	if err != nil {
		cancel()
		_ = bs.CloseRequest()
		_ = bs.CloseResponse()
		return nil, err
	}
	return &muxConn{c: mp.c, addr: p.addr, bs: bs, cancel: cancel, mac: mac, calls: map[uint64]*muxCall{}}, nil
}

// close ends every stream; later gets return nil.
func (mp *muxPeers) close() {
	mp.mu.Lock()
	mp.closed = true
	peers := mp.peers
	mp.mu.Unlock()
	for _, p := range peers {
		if mc := p.conn.Load(); mc != nil {
			mc.fail(errors.New("client closed"))
		}
	}
}

// muxConn is one open Multiplex stream.
type muxConn struct {
	c      *Client
	addr   string
	bs     *connect.BidiStreamForClient[forwardv1.MultiplexRequest, forwardv1.MultiplexResponse]
	cancel context.CancelFunc
	mac    *frameMAC // nil when the peer needs no frame MACs (mutual TLS)

	// qmu guards nextID, mac, the queue of frames to send and sending.
	// Frames are sent by whichever caller finds nobody sending: it sends
	// what others queue meanwhile too, as one batch, so concurrent calls
	// share writes without a sender goroutine (which would cost a
	// goroutine switch per call when there is no concurrency).
	qmu       sync.Mutex
	nextID    uint64
	queue     []*forwardv1.MultiplexRequest
	spare     []*forwardv1.MultiplexRequest
	bufs      []*[]byte // marshal buffers of the queued frames
	spareBufs []*[]byte
	sending   bool
	// sendStart is when the write in progress began (Unix ns), 0 when
	// none is.
	sendStart atomic.Int64

	mu    sync.Mutex
	calls map[uint64]*muxCall
	dead  bool
}

// errMuxUnusable reports a stream that broke before a call went out on it:
// the call takes the per-call path instead.
var errMuxUnusable = errors.New("forward: multiplex stream unusable")

// forward sends one call and returns its response stream.
func (mc *muxConn) forward(ctx context.Context, msg *forwardv1.ForwardRequest, unary bool) (*Stream, error) {
	call := &muxCall{mc: mc, frames: make(chan *forwardv1.MultiplexResponse, muxCallQueue), broken: make(chan struct{}), gone: make(chan struct{})}
	var timeout int64
	if dl, ok := ctx.Deadline(); ok {
		timeout = max(time.Until(dl).Milliseconds(), 1)
	}
	bp := mc.c.bufs.Get().(*[]byte)
	raw, err := proto.MarshalOptions{}.MarshalAppend((*bp)[:0], msg)
	if err != nil {
		mc.c.bufs.Put(bp)
		return nil, err
	}
	*bp = raw
	mc.qmu.Lock()
	mc.nextID++
	call.id = mc.nextID
	mc.mu.Lock()
	if mc.dead {
		mc.mu.Unlock()
		mc.qmu.Unlock()
		mc.c.bufs.Put(bp)
		return nil, errMuxUnusable
	}
	mc.calls[call.id] = call
	mc.mu.Unlock()
	frame := &forwardv1.MultiplexCall{Id: call.id, Request: raw, TimeoutMs: timeout, Unary: unary}
	if mc.mac != nil {
		frame.Mac = mc.mac.sum(nil, frameCall, call.id, raw)
	}
	// This caller may become the stream's sender, and a write to a peer
	// that stopped reading (a partition) blocks on flow control with no
	// regard for ctx. Once ctx ends while the frame is still being pushed,
	// watch the write: stuck past muxSendStall, it ends the stream, which
	// releases the write and fails the calls retryably (before their head,
	// dispatch tries the next candidate).
	// One context watch serves both: the stall watch while the frame is
	// being pushed, and abandoning the call afterwards (two registrations
	// per call showed in the entry node's allocations).
	call.stop = context.AfterFunc(ctx, func() {
		if !call.pushed.Load() {
			mc.watchStall(&call.pushed)
		}
		call.abandon()
	})
	// Counted before the push: once the frame is out the peer may answer
	// (and a watcher may read the counter) before this goroutine resumes.
	mc.c.met.muxCalls.Inc()
	mc.push(&forwardv1.MultiplexRequest{Frame: &forwardv1.MultiplexRequest_Call{Call: frame}}, bp)
	call.pushed.Store(true)
	return &Stream{m: call, ctx: ctx, met: mc.c.met}, nil
}

// watchStall ends the stream once a write has been in progress for
// muxSendStall, checking until done is set (the watching caller's frame
// was handed over) or the stream ends.
func (mc *muxConn) watchStall(done *atomic.Bool) {
	var check func()
	check = func() {
		if done.Load() {
			return
		}
		if t := mc.sendStart.Load(); t != 0 && time.Since(time.Unix(0, t)) >= muxSendStall {
			mc.fail(errors.New("writes stalled"))
			return
		}
		mc.mu.Lock()
		dead := mc.dead
		mc.mu.Unlock()
		if !dead {
			time.AfterFunc(muxSendStall/4, check)
		}
	}
	check()
}

// readLoop routes the peer's frames to their calls until the stream ends.
func (mc *muxConn) readLoop(p *muxPeer) {
	defer p.conn.CompareAndSwap(mc, nil)
	for {
		msg, err := mc.bs.Receive()
		if err != nil {
			mc.fail(err)
			return
		}
		final := false
		switch f := msg.GetFrame().(type) {
		case *forwardv1.MultiplexResponse_Response:
			final = f.Response.GetTrailer() != nil || f.Response.GetWhole() != nil
		case *forwardv1.MultiplexResponse_Error:
			final = true
		default:
			mc.fail(fmt.Errorf("%w: unexpected multiplex frame %T", ErrProtocol, f))
			return
		}
		mc.mu.Lock()
		call := mc.calls[msg.GetId()]
		if final {
			delete(mc.calls, msg.GetId())
		}
		mc.mu.Unlock()
		if call == nil {
			continue // abandoned by its caller
		}
		select {
		case call.frames <- msg:
		case <-call.gone:
		}
	}
}

// fail ends the stream: every call not yet finished sees err (after the
// frames that reached it), and the next request opens a new stream.
func (mc *muxConn) fail(cause error) {
	mc.mu.Lock()
	if mc.dead {
		mc.mu.Unlock()
		return
	}
	mc.dead = true
	calls := mc.calls
	mc.calls = nil
	mc.mu.Unlock()
	mc.cancel()
	// Cancelling the call does not release a write blocked on the HTTP/2
	// stream's flow control (the transport is not reading Connect's request
	// pipe); closing the request side does.
	go func() { _ = mc.bs.CloseRequest() }()
	// Unavailable: a call that had no head yet is retried elsewhere. The
	// cause is formatted, not wrapped: a stream ended by our own cancel
	// must not look like the caller's cancellation. Each call gets its own
	// error: a *connect.Error's metadata is filled in lazily, so sharing
	// one between callers would race.
	msg := fmt.Sprintf("forward: multiplex stream to %s broke: %v", mc.addr, cause)
	for _, call := range calls {
		call.err = connect.NewError(connect.CodeUnavailable, errors.New(msg))
		close(call.broken)
	}
	if len(calls) > 0 {
		mc.c.log.Warn("multiplex stream broke", "peer", mc.addr, "calls", len(calls), "err", cause)
	}
}

// muxCall is one call on a stream, seen by its Stream.
type muxCall struct {
	mc     *muxConn
	id     uint64
	frames chan *forwardv1.MultiplexResponse
	broken chan struct{} // closed by fail, after err is set
	err    error
	gone   chan struct{} // closed when the caller abandons the call
	once   sync.Once
	stop   func() bool // stops the context watch
	pushed atomic.Bool // the call's frame was handed to the stream
}

// recv returns the call's next frame, the stream's failure once the frames
// that reached the call are read, or ctx's end.
func (c *muxCall) recv(ctx context.Context) (*forwardv1.MultiplexResponse, error) {
	select {
	case m := <-c.frames:
		return m, nil
	default:
	}
	select {
	case m := <-c.frames:
		return m, nil
	case <-c.broken:
		select {
		case m := <-c.frames:
			return m, nil
		default:
			return nil, c.err
		}
	case <-ctx.Done():
		code := connect.CodeCanceled
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			code = connect.CodeDeadlineExceeded
		}
		return nil, connect.NewError(code, ctx.Err())
	}
}

// finish releases a call whose last frame was read, or that its caller
// closes: the context watch stops and, unless the call ended, the peer is
// told to cancel it.
func (c *muxCall) finish() {
	if c.stop != nil {
		c.stop()
	}
	c.abandon()
}

// abandon gives up a call (the caller's context ended, or it closed the
// stream): the reader stops delivering its frames, and the peer is told to
// cancel it unless it has finished.
func (c *muxCall) abandon() {
	c.once.Do(func() { close(c.gone) })
	mc := c.mc
	if t := mc.sendStart.Load(); t != 0 {
		// A write is in progress. If it stays stuck past muxSendStall (a
		// peer that stopped reading: partitioned, paused) while callers
		// give up, end the stream, which unblocks the write and fails its
		// calls, rather than hold the sending caller until pings notice.
		wait := muxSendStall - time.Since(time.Unix(0, t))
		if wait <= 0 {
			mc.fail(errors.New("writes stalled"))
			return
		}
		time.AfterFunc(wait, func() {
			if mc.sendStart.Load() == t {
				mc.fail(errors.New("writes stalled"))
			}
		})
	}
	mc.mu.Lock()
	_, pending := mc.calls[c.id]
	if pending {
		delete(mc.calls, c.id)
	}
	dead := mc.dead
	mc.mu.Unlock()
	if !pending || dead {
		return
	}
	frame := &forwardv1.MultiplexCancel{Id: c.id}
	mc.qmu.Lock()
	if mc.mac != nil {
		frame.Mac = mc.mac.sum(nil, frameCancel, c.id, nil)
	}
	mc.push(&forwardv1.MultiplexRequest{Frame: &forwardv1.MultiplexRequest_Cancel{Cancel: frame}}, nil)
}

// push queues a frame (with the marshal buffer to release once it is
// sent, or nil) and, unless another goroutine is sending, sends the queue
// until it is empty. It is called with qmu held and releases it. A failed
// send fails the stream: the calls in it see a retryable error.
func (mc *muxConn) push(f *forwardv1.MultiplexRequest, buf *[]byte) {
	mc.queue = append(mc.queue, f)
	if buf != nil {
		mc.bufs = append(mc.bufs, buf)
	}
	if mc.sending {
		mc.qmu.Unlock()
		return
	}
	mc.sending = true
	for {
		// With other calls in flight, more frames are likely on their
		// way: let their goroutines run first and queue them, so one
		// write carries several (measured: 8–13 % less CPU per forwarded
		// request on the entry node at c=64). Alone, send at once.
		mc.mu.Lock()
		busy := len(mc.calls) > 1
		mc.mu.Unlock()
		if busy {
			mc.qmu.Unlock()
			runtime.Gosched()
			mc.qmu.Lock()
		}
		q, bufs := mc.queue, mc.bufs
		mc.queue, mc.spare = mc.spare[:0], q
		mc.bufs, mc.spareBufs = mc.spareBufs[:0], bufs
		mc.qmu.Unlock()
		msg := q[0]
		if len(q) > 1 {
			msg = &forwardv1.MultiplexRequest{Frame: &forwardv1.MultiplexRequest_Batch{Batch: &forwardv1.MultiplexBatch{Frames: q}}}
		}
		mc.sendStart.Store(time.Now().UnixNano())
		err := mc.bs.Send(msg)
		mc.sendStart.Store(0)
		clear(q)
		for i, b := range bufs {
			if cap(*b) <= 256<<10 { // Send has encoded the frames; keep small buffers
				mc.c.bufs.Put(b)
			}
			bufs[i] = nil
		}
		mc.qmu.Lock()
		if err != nil || len(mc.queue) == 0 {
			mc.sending = false
			mc.qmu.Unlock()
			if err != nil {
				mc.fail(err)
			}
			return
		}
	}
}

// muxError turns a MultiplexError frame into the error the per-call path
// would have returned, so IsDraining, Retryable and the metrics see the
// same.
func muxError(e *forwardv1.MultiplexError) error {
	var code connect.Code
	if err := code.UnmarshalText([]byte(e.GetCode())); err != nil {
		code = connect.CodeUnknown
	}
	ce := connect.NewError(code, errors.New(e.GetMessage()))
	if r := e.GetRefusal(); r != "" {
		ce.Meta().Set(RefusalHeader, r)
	}
	return ce
}
