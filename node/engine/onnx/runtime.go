// Package onnx is the in-process ONNX Runtime engine. It owns the link to the
// ONNX Runtime shared library and builds one pipeline per model task
// (embeddings, background removal) on reusable sessions.
package onnx

import (
	"fmt"
	"sync"
	"time"

	"github.com/infermesh/infermesh/node/engine"

	ort "github.com/yalue/onnxruntime_go"
)

// The ONNX Runtime C environment is process-wide by construction of the C API
// (one OrtEnv per process). These variables are the only package-level state
// in the project; they refcount the environment so several Runtimes (several
// nodes in one test process) can share it safely.
var (
	envMu   sync.Mutex
	envRefs int
	envLib  string
)

// Config configures a Runtime.
type Config struct {
	// LibraryPath is the path to libonnxruntime.so.
	LibraryPath string
	// IntraOpThreads bounds the threads one session run may use. 0 chooses
	// per pipeline (see EmbedThreads): embeddings run one thread per run
	// with one run per core; the other pipelines use ONNX Runtime's pool
	// (one thread per core for one run). -1 uses ONNX Runtime's pool for
	// every pipeline.
	IntraOpThreads int
	// MaxBatch is the dynamic batcher's largest batch (embeddings).
	MaxBatch int
	// MaxWaitMicros is how long the batcher waits to fill a batch.
	MaxWaitMicros int
	// ReleaseArena turns ONNX Runtime's CPU memory arena off for every
	// session this runtime builds, unless a model's "memory_arena" option
	// says otherwise (see ForModel). With the arena a session
	// keeps the largest activations it ever needed until the model is
	// unloaded (about 800 MB more after one ISNet-small run at 1024x1024);
	// without it each run's buffers go back to the C allocator when the
	// run ends, and the large ones to the operating system (about 180-250
	// MB held), but every run maps and faults in its activations again
	// (about 2x the time per ISNet run; BenchmarkArenaISNet).
	ReleaseArena bool
	// ArenaIdle, with the arena kept, is how long a model may go without
	// a run before its pipeline gives the arena back by rebuilding its
	// session (0: never). Background removal does so; the other pipelines
	// keep the arena while loaded. A model's "memory_arena" option given
	// as a duration overrides it.
	ArenaIdle time.Duration
}

// ArenaSetting is a parsed memory arena setting (see ParseArena).
type ArenaSetting struct {
	// Release turns the CPU memory arena off.
	Release bool
	// Idle, with the arena on, is how long a model may go without runs
	// before a pipeline that can gives the arena back (0: never).
	Idle time.Duration
}

// ParseArena reads a memory arena setting: "on" keeps ONNX Runtime's CPU
// arena while the model is loaded, "off" releases run memory after each
// run, and a positive duration ("5m") keeps the arena but gives it back
// once the model has had no run for that long.
func ParseArena(s string) (ArenaSetting, error) {
	switch s {
	case "on":
		return ArenaSetting{}, nil
	case "off":
		return ArenaSetting{Release: true}, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return ArenaSetting{}, fmt.Errorf("memory arena %q: want on, off or a positive duration (e.g. 5m)", s)
	}
	return ArenaSetting{Idle: d}, nil
}

// ArenaOption is the model option (engine.Spec.Options) that chooses a
// model's memory arena (see ParseArena): "on" keeps ONNX Runtime's CPU
// arena, "off" releases run memory after each run, a duration keeps the
// arena and gives it back after that long without runs; empty follows
// Config.ReleaseArena and Config.ArenaIdle.
const ArenaOption = "memory_arena"

// Runtime is a handle on ONNX Runtime for one node, or one model's view
// of it (see ForModel).
type Runtime struct {
	cfg Config
	// arena reports whether the sessions this handle builds keep ONNX
	// Runtime's CPU memory arena.
	arena bool
	// idle, with arena, is how long the model may go without runs before
	// a pipeline that can gives the arena back (0: never).
	idle time.Duration
	// view marks a handle made by ForModel: Close does nothing on it.
	view bool
	// hold is the node's hold on the environment, shared by its views.
	hold *envHold
}

// envHold is one node's hold on the process's ONNX Runtime environment.
type envHold struct {
	mu     sync.Mutex
	closed bool
}

// NewRuntime initialises (or joins) the process's ONNX Runtime environment.
func NewRuntime(cfg Config) (*Runtime, error) {
	if cfg.LibraryPath == "" {
		return nil, fmt.Errorf("onnx: library path is empty")
	}
	envMu.Lock()
	defer envMu.Unlock()
	if envRefs == 0 {
		ort.SetSharedLibraryPath(cfg.LibraryPath)
		if err := ort.InitializeEnvironment(ort.WithLogLevelError()); err != nil {
			return nil, fmt.Errorf("onnx: initialise runtime from %s: %w", cfg.LibraryPath, err)
		}
		envLib = cfg.LibraryPath
	} else if envLib != cfg.LibraryPath {
		return nil, fmt.Errorf("onnx: runtime already loaded from %s, cannot also load %s", envLib, cfg.LibraryPath)
	}
	envRefs++
	r := &Runtime{cfg: cfg, arena: !cfg.ReleaseArena, hold: &envHold{}}
	if r.arena {
		r.idle = max(cfg.ArenaIdle, 0)
	}
	return r, nil
}

// Version reports the loaded ONNX Runtime version.
func (r *Runtime) Version() string { return ort.GetVersion() }

// Config returns the runtime's configuration.
func (r *Runtime) Config() Config { return r.cfg }

// EmbedThreads is the intra-op threads of one embeddings run: the
// configured value, or 1 when it is 0 (auto). Embedding runs are small;
// on this project's 2-core reference machine one single-threaded run per
// core gives 1.6-3.0x the throughput of one run on ORT's pool at 16
// callers with the batcher on (BenchmarkEmbeddingsThreadDefaults).
// A negative setting asks for ONNX Runtime's own pool everywhere (0).
func (r *Runtime) EmbedThreads() int {
	switch {
	case r.cfg.IntraOpThreads > 0:
		return r.cfg.IntraOpThreads
	case r.cfg.IntraOpThreads < 0:
		return 0
	}
	return 1
}

// ForModel returns the runtime as the sessions of one model see it: the
// model's ArenaOption, when set, chooses the memory arena instead of the
// handle's own setting (Config.ReleaseArena and ArenaIdle on the node's
// handle); a value ParseArena refuses is an error. Every pipeline loader
// calls it first and builds all of the model's sessions from the view's
// SessionOptions, so the option reaches every session. A nil runtime is an error. The
// view shares the node's hold on
// the environment; closing it does nothing.
func (r *Runtime) ForModel(spec engine.Spec) (*Runtime, error) {
	if r == nil {
		return nil, fmt.Errorf("onnx: %s: no runtime", spec.ID)
	}
	v := &Runtime{cfg: r.cfg, arena: r.arena, idle: r.idle, view: true, hold: r.hold}
	if s := spec.Options[ArenaOption]; s != "" {
		a, err := ParseArena(s)
		if err != nil {
			return nil, fmt.Errorf("onnx: %s: option %s: %w", spec.ID, ArenaOption, err)
		}
		v.arena, v.idle = !a.Release, a.Idle
	}
	return v, nil
}

// KeepsArena reports whether the sessions this handle builds keep ONNX
// Runtime's CPU memory arena.
func (r *Runtime) KeepsArena() bool { return r.arena }

// ArenaIdle is how long a model may go without runs before a pipeline that
// can gives its arena back (0: never; always 0 when the arena is off).
func (r *Runtime) ArenaIdle() time.Duration { return r.idle }

// SessionOptions builds session options with the handle's thread and
// arena settings; a pipeline calls it on its model's view (ForModel). The
// caller destroys them after creating its session.
func (r *Runtime) SessionOptions() (*ort.SessionOptions, error) {
	return r.sessionOptions(r.cfg.IntraOpThreads)
}

// sessionOptions builds session options for runs of threads intra-op
// threads (0: ONNX Runtime's pool) and the handle's arena setting.
func (r *Runtime) sessionOptions(threads int) (*ort.SessionOptions, error) {
	return r.threadArenaOptions(threads, r.arena)
}

// threadArenaOptions builds session options for runs of threads intra-op
// threads, with or without the CPU memory arena.
func (r *Runtime) threadArenaOptions(threads int, arena bool) (*ort.SessionOptions, error) {
	threads = max(threads, 0)
	opts, err := ort.NewSessionOptions()
	if err != nil {
		return nil, err
	}
	if !arena {
		if err := opts.SetCpuMemArena(false); err != nil {
			opts.Destroy()
			return nil, err
		}
	}
	if threads > 0 {
		if err := opts.SetIntraOpNumThreads(threads); err != nil {
			opts.Destroy()
			return nil, err
		}
	}
	if err := opts.SetInterOpNumThreads(1); err != nil {
		opts.Destroy()
		return nil, err
	}
	return opts, nil
}

// Close releases this node's hold on the environment; the last one destroys it.
// A model's view (ForModel) has no hold of its own: closing it does
// nothing.
func (r *Runtime) Close() error {
	if r.view {
		return nil
	}
	r.hold.mu.Lock()
	if r.hold.closed {
		r.hold.mu.Unlock()
		return nil
	}
	r.hold.closed = true
	r.hold.mu.Unlock()
	envMu.Lock()
	defer envMu.Unlock()
	envRefs--
	if envRefs == 0 {
		return ort.DestroyEnvironment()
	}
	return nil
}

// checkLoad refuses to load a model on a closed runtime or for another task
// (an empty spec task is accepted), and returns the model's view of the
// runtime (ForModel), from which the loader builds the model's sessions.
func (r *Runtime) checkLoad(spec engine.Spec, task engine.Task) (*Runtime, error) {
	r.hold.mu.Lock()
	closed := r.hold.closed
	r.hold.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("onnx: runtime is closed")
	}
	if spec.Task != "" && spec.Task != task {
		return nil, fmt.Errorf("onnx: %s: task %q is not %q", spec.ID, spec.Task, task)
	}
	return r.ForModel(spec)
}
