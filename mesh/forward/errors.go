package forward

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"

	"connectrpc.com/connect"
)

// IsRefused reports whether err means the peer refused the connection
// (nothing listens there): the caller should eject the peer from routing.
func IsRefused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED)
}

// IsUnreachable reports whether the peer could not be reached at all:
// refused, or the dial failed or timed out (partitioned, paused, gone).
// The caller should stop routing to it until gossip says otherwise.
func IsUnreachable(err error) bool {
	if IsRefused(err) {
		return true
	}
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

// IsDraining reports whether the peer refused the call because it drains.
func IsDraining(err error) bool {
	var ce *connect.Error
	return errors.As(err, &ce) && ce.Code() == connect.CodeUnavailable && ce.Meta().Get(RefusalHeader) == "draining"
}

// tooLarge reports a ForwardUnary refusal of a response over the unary
// limit.
func tooLarge(err error) bool {
	var ce *connect.Error
	return errors.As(err, &ce) && ce.Meta().Get(RefusalHeader) == refusalTooLarge
}

// Retryable reports whether a failure that happened before the response
// head is safe to retry on another peer: connection refused or reset, the
// peer unavailable or draining, overloaded, or rejecting this node's cluster
// secret (a misconfigured peer). Failures of the caller's own context are
// not retryable.
func Retryable(err error) bool {
	if err == nil {
		return false
	}
	// Transport failures first: connect reports a reset connection of a
	// killed peer as code "canceled", and a dial timeout to a partitioned
	// peer matches context.DeadlineExceeded (net's timeout error says so);
	// neither means the caller gave up. The dispatcher checks the caller's
	// own context separately.
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" {
		return true
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	switch connect.CodeOf(err) {
	case connect.CodeCanceled, connect.CodeDeadlineExceeded:
		return false
	case connect.CodeUnavailable, connect.CodeResourceExhausted, connect.CodeAborted, connect.CodeUnauthenticated:
		return true
	}
	return false
}

// resultOf names an outcome for metrics.
func resultOf(err error) string {
	switch {
	case err == nil:
		return "ok"
	case IsRefused(err):
		return "refused"
	case IsDraining(err):
		return "draining"
	case connect.CodeOf(err) == connect.CodeUnavailable:
		return "unavailable"
	default:
		return "error"
	}
}
