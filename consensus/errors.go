package consensus

import (
	"errors"
	"fmt"

	pb "github.com/infermesh/infermesh/proto/gen/infermesh/consensus/v1"
)

// ErrNoLeader means no leader could be reached within Config.LeaderWait, so
// the command was not applied by this call. The HTTP layer answers 503 with
// Retry-After. Errors that also match ErrOutcomeUnknown match ErrNoLeader.
var ErrNoLeader = errors.New("consensus: no reachable leader")

// ErrOutcomeUnknown means the leader was reached but the call broke before
// its answer arrived: the command may or may not have been applied. It
// always comes wrapped together with ErrNoLeader.
var ErrOutcomeUnknown = errors.New("consensus: command outcome unknown")

// ErrHalted means the state machine stopped at an entry it must not skip;
// the node is shutting down (see Config.OnFatal).
var ErrHalted = errors.New("consensus: state machine halted")

// ErrInvalidCommand means the command was refused before it reached the log:
// it is malformed, or of a type this leader does not know and not ignorable.
var ErrInvalidCommand = errors.New("consensus: invalid command")

// Sentinels matched by RejectedError through errors.Is.
var (
	ErrNotFound   = errors.New("consensus: not found")
	ErrConflict   = errors.New("consensus: conflict")
	ErrInvalid    = errors.New("consensus: invalid")
	ErrInactive   = errors.New("consensus: key revoked or expired")
	ErrAlreadySet = errors.New("consensus: already set")
	ErrDuplicate  = errors.New("consensus: duplicate")
)

const (
	codeNotFound   = "not_found"
	codeConflict   = "conflict"
	codeInvalid    = "invalid"
	codeInactive   = "inactive"
	codeAlreadySet = "already_set"
	codeDuplicate  = "duplicate"
)

// RejectedError is a command the state machine applied as a refusal: it is
// in the log, at Index, and changed nothing. Code is one of not_found,
// conflict, invalid, inactive, already_set, duplicate.
type RejectedError struct {
	Index   uint64 // log index of the refused command
	Code    string // machine-readable reason
	Message string // human-readable reason
}

// Error describes the refusal.
func (e *RejectedError) Error() string {
	return fmt.Sprintf("consensus: rejected (%s): %s", e.Code, e.Message)
}

// Is matches the sentinel of the code.
func (e *RejectedError) Is(target error) bool {
	switch e.Code {
	case codeNotFound:
		return target == ErrNotFound
	case codeConflict:
		return target == ErrConflict
	case codeInvalid:
		return target == ErrInvalid
	case codeInactive:
		return target == ErrInactive
	case codeAlreadySet:
		return target == ErrAlreadySet
	case codeDuplicate:
		return target == ErrDuplicate
	}
	return false
}

func reject(code, format string, args ...any) *pb.ApplyResult {
	return &pb.ApplyResult{RejectionCode: code, RejectionMessage: fmt.Sprintf(format, args...)}
}

// outcomeUnknown wraps err so it matches ErrNoLeader and ErrOutcomeUnknown.
func outcomeUnknown(err error) error {
	return fmt.Errorf("%w: %w: %w", ErrNoLeader, ErrOutcomeUnknown, err)
}
