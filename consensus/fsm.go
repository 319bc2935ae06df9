package consensus

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	pb "github.com/infermesh/infermesh/proto/gen/infermesh/consensus/v1"
)

// snapshotFormat is the version of the Snapshot message layout.
const snapshotFormat = 1

// fsm is the raft state machine. Apply is deterministic: it reads nothing
// but the entry (time comes inside the command), does no I/O and never
// depends on map iteration order. Readers take the read lock through View.
type fsm struct {
	mu      sync.RWMutex
	st      *state
	applied uint64
	halted  error

	onFatal func(error)
	logger  *slog.Logger
}

// applyOutcome is what FSM.Apply returns to raft's ApplyFuture.
type applyOutcome struct {
	res *pb.ApplyResult
	err error
}

func newFSM(logger *slog.Logger, onFatal func(error)) *fsm {
	return &fsm{st: newState(), logger: logger, onFatal: onFatal}
}

// Apply implements raft.FSM.
func (f *fsm) Apply(l *raft.Log) any {
	return f.applyEntry(l.Index, l.Data)
}

func (f *fsm) applyEntry(index uint64, data []byte) applyOutcome {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.halted != nil {
		return applyOutcome{err: f.halted}
	}
	var cmd pb.Command
	if err := proto.Unmarshal(data, &cmd); err != nil {
		return f.halt(fmt.Errorf("log entry %d is not a command: %w", index, err))
	}
	res, err := f.st.apply(index, &cmd)
	switch {
	case errors.Is(err, errUnknownCommand) && cmd.GetIgnorable():
		f.logger.Warn("skipping unknown ignorable command", "index", index, "type", int32(cmd.GetType()))
		f.applied = index
		return applyOutcome{res: &pb.ApplyResult{Index: index, Skipped: true}}
	case errors.Is(err, errUnknownCommand):
		return f.halt(fmt.Errorf("log entry %d has command type %d, unknown to this version and not ignorable", index, int32(cmd.GetType())))
	case err != nil:
		return f.halt(fmt.Errorf("log entry %d: %w", index, err))
	}
	f.applied = index
	return applyOutcome{res: res}
}

// halt stops the state machine for good: every later entry is refused, so
// this replica never applies past an entry it could not understand. The
// node is told through OnFatal (on its own goroutine, since raft's FSM
// goroutine must not wait for the shutdown it triggers).
func (f *fsm) halt(err error) applyOutcome {
	f.halted = fmt.Errorf("%w: %w", ErrHalted, err)
	f.logger.Error("state machine halted; the node must stop", "err", err)
	if f.onFatal != nil {
		go f.onFatal(f.halted)
	}
	return applyOutcome{err: f.halted}
}

// Snapshot implements raft.FSM. It copies the state into its canonical
// protobuf form; Persist encodes and writes it.
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.halted != nil {
		return nil, f.halted
	}
	return &fsmSnapshot{snap: &pb.Snapshot{Format: snapshotFormat, AppliedIndex: f.applied, State: f.st.toProto()}}, nil
}

// Restore implements raft.FSM: it builds a fresh state from the snapshot and
// swaps it in only when the whole snapshot decoded.
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return fmt.Errorf("consensus: read snapshot: %w", err)
	}
	fresh, applied, err := decodeSnapshot(b)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.st, f.applied = fresh, applied
	f.mu.Unlock()
	return nil
}

func decodeSnapshot(b []byte) (*state, uint64, error) {
	var snap pb.Snapshot
	if err := proto.Unmarshal(b, &snap); err != nil {
		return nil, 0, fmt.Errorf("consensus: decode snapshot: %w", err)
	}
	if snap.GetFormat() != snapshotFormat {
		return nil, 0, fmt.Errorf("consensus: snapshot format %d is not supported (want %d)", snap.GetFormat(), snapshotFormat)
	}
	st, err := stateFromProto(snap.GetState())
	if err != nil {
		return nil, 0, err
	}
	return st, snap.GetAppliedIndex(), nil
}

func (f *fsm) read(fn func(s *state)) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	fn(f.st)
}

type fsmSnapshot struct {
	snap *pb.Snapshot
}

// Persist encodes the snapshot deterministically and writes it to the sink.
func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(s.snap)
	if err == nil {
		_, err = sink.Write(b)
	}
	if err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("consensus: persist snapshot: %w", err)
	}
	return sink.Close()
}

// Release implements raft.FSMSnapshot.
func (s *fsmSnapshot) Release() {}
