package node

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/infermesh/infermesh/node/api"
	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/diffusion"
	"github.com/infermesh/infermesh/node/engine/llama"
	"github.com/infermesh/infermesh/node/engine/onnx"
	"github.com/infermesh/infermesh/node/engine/tts"
	"github.com/infermesh/infermesh/node/engine/upscale"
	"github.com/infermesh/infermesh/node/engine/upstream"
	"github.com/infermesh/infermesh/node/engine/vision"
	"github.com/infermesh/infermesh/node/engine/whisper"
	"github.com/infermesh/infermesh/node/models"
)

// engines owns the node's loaded models. A loaded model is warm. Loads of
// the same model by concurrent requests are shared (singleflight).
type engines struct {
	cfg   Config
	log   *slog.Logger
	store *models.Store
	group singleflight.Group

	// onChange is called after a model becomes warm.
	onChange func()
	// upstream serves the provider models (nil: none configured).
	upstream *upstream.Registry

	mu     sync.RWMutex
	rt     *onnx.Runtime
	llama  *llama.Runtime
	loaded map[string]engine.Engine
	// used is when each model last served a request on this node.
	used map[string]time.Time
	// clock stamps used.
	clock func() time.Time
	// mem estimates the memory each loaded model holds.
	mem *modelMemory
}

func newEngines(cfg Config, log *slog.Logger, store *models.Store) *engines {
	clock := cfg.Clock
	if clock == nil {
		clock = time.Now
	}
	return &engines{cfg: cfg, log: log, store: store, loaded: map[string]engine.Engine{}, used: map[string]time.Time{}, clock: clock, mem: newModelMemory()}
}

// runtime returns the node's ONNX Runtime handle, creating it on first use.
func (e *engines) runtime() (*onnx.Runtime, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.rt != nil {
		return e.rt, nil
	}
	if _, err := os.Stat(e.cfg.ORTLibrary); err != nil {
		return nil, fmt.Errorf("ONNX Runtime library not found at %s (run `make assets` or set SERVICE_ORT_LIBRARY): %w", e.cfg.ORTLibrary, err)
	}
	arena, err := onnx.ParseArena(e.cfg.MemoryArena)
	if err != nil {
		return nil, err
	}
	rt, err := onnx.NewRuntime(onnx.Config{
		LibraryPath:    e.cfg.ORTLibrary,
		IntraOpThreads: e.cfg.IntraOpThreads,
		ReleaseArena:   arena.Release,
		ArenaIdle:      arena.Idle,
		MaxBatch:       e.cfg.BatchMax,
		MaxWaitMicros:  int(e.cfg.BatchWait.Microseconds()),
	})
	if err != nil {
		return nil, err
	}
	e.rt = rt
	return rt, nil
}

// llamaRuntime returns the node's llama.cpp runtime for GGUF models,
// loading the library on first use.
func (e *engines) llamaRuntime() (*llama.Runtime, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.llama != nil {
		return e.llama, nil
	}
	rt, err := llama.NewRuntime(e.cfg.LlamaDir, llama.Config{Threads: e.cfg.LlamaThreads, Poll: e.cfg.LlamaPoll})
	if err != nil {
		return nil, fmt.Errorf("%w (run `make assets` or set SERVICE_LLAMA_DIR)", err)
	}
	e.llama = rt
	e.log.Info("llama.cpp loaded", "dir", e.cfg.LlamaDir, "version", rt.Version())
	return rt, nil
}

// loadAll warms every installed model; a model that fails to load is
// logged and stays installed but cold.
func (e *engines) loadAll(ctx context.Context) error {
	for _, m := range e.store.List() {
		if _, err := e.load(m); err != nil {
			e.log.Error("model failed to load", "id", m.ID, "err", err)
		}
	}
	return nil
}

// get returns the warm engine for id, loading it if needed, and checks its task.
func (e *engines) get(ctx context.Context, id string, task engine.Task) (engine.Engine, error) {
	if eng, ok, err := e.fromUpstream(ctx, id, task); ok {
		return eng, err
	}
	m, err := e.store.Get(id)
	if err != nil {
		return nil, errNotFound(id)
	}
	if engine.Task(m.Task) != task {
		return nil, fmt.Errorf("model %s serves the %s task: %w", m.ID, m.Task, api.ErrWrongTask)
	}
	e.mu.Lock()
	eng := e.loaded[m.ID]
	e.used[m.ID] = e.clock()
	e.mu.Unlock()
	if eng != nil {
		return eng, nil
	}
	return e.load(m)
}

// lastUsed is when a model last served a request here (zero: never since
// the node started).
func (e *engines) lastUsed(id string) time.Time {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.used[id]
}

// unload closes a model's engine, if loaded.
func (e *engines) unload(id string) {
	e.mu.Lock()
	eng := e.loaded[id]
	delete(e.loaded, id)
	e.mu.Unlock()
	e.mem.forget(id)
	if eng != nil {
		if err := eng.Close(); err != nil {
			e.log.Warn("close engine", "id", id, "err", err)
		}
	}
}

func (e *engines) load(m *models.Manifest) (engine.Engine, error) {
	v, err, _ := e.group.Do(m.ID, func() (any, error) {
		e.mu.RLock()
		eng := e.loaded[m.ID]
		e.mu.RUnlock()
		if eng != nil {
			return eng, nil
		}
		spec := engine.Spec{ID: m.ID, Task: engine.Task(m.Task), Dir: e.store.Dir(m), Files: m.Files, Options: m.Options}
		var err error
		measured := e.mem.beginLoad()
		switch m.Runtime() {
		case "onnx":
			var rt *onnx.Runtime
			if rt, err = e.runtime(); err != nil {
				return nil, err
			}
			switch spec.Task {
			case engine.TaskEmbeddings:
				eng, err = rt.LoadEmbedder(spec)
			case engine.TaskBackgroundRemoval:
				eng, err = rt.LoadBackgroundRemover(spec)
			case engine.TaskChat:
				eng, err = rt.LoadChat(spec)
			case engine.TaskObjectDetection:
				eng, err = vision.LoadDetector(rt, spec)
			case engine.TaskFaceDetection:
				eng, err = vision.LoadFaces(rt, spec)
			case engine.TaskTextRecognition:
				eng, err = vision.LoadOCR(rt, spec)
			case engine.TaskImageDescription:
				if strings.HasPrefix(spec.ID, "onnx/composed-describer/") || spec.Options["format"] == "composed" {
					eng, err = vision.LoadComposedDescriber(rt, spec)
				} else {
					eng, err = vision.LoadFlorence(rt, spec)
				}
			case engine.TaskTextToSpeech:
				if spec.Options["format"] == "piper" {
					eng, err = tts.LoadPiper(rt, spec)
				} else {
					eng, err = tts.LoadKokoro(rt, spec)
				}
			case engine.TaskVoiceCloning:
				eng, err = tts.LoadCloner(rt, spec)
			case engine.TaskSpeechToText:
				eng, err = whisper.Load(rt, spec)
			case engine.TaskVoiceActivity:
				eng, err = whisper.LoadVAD(rt, spec)
			case engine.TaskImageUpscale:
				eng, err = upscale.LoadUpscaler(rt, spec)
			case engine.TaskImageGeneration:
				eng, err = diffusion.LoadImageGenerator(rt, spec)
			default:
				err = fmt.Errorf("the onnx runtime has no pipeline for task %q", spec.Task)
			}
		case "gguf":
			var rt *llama.Runtime
			if rt, err = e.llamaRuntime(); err != nil {
				return nil, err
			}
			switch spec.Task {
			case engine.TaskChat:
				eng, err = rt.LoadChat(spec)
			case engine.TaskEmbeddings:
				eng, err = rt.LoadEmbedder(spec)
			default:
				err = fmt.Errorf("the gguf runtime has no pipeline for task %q", spec.Task)
			}
		default:
			err = fmt.Errorf("runtime %q is not available on this node", m.Runtime())
		}
		measured(m.ID, err == nil)
		if err != nil {
			return nil, fmt.Errorf("load %s: %w", m.ID, err)
		}
		e.mu.Lock()
		e.loaded[m.ID] = eng
		e.mu.Unlock()
		e.log.Info("model warm", "id", m.ID, "task", m.Task)
		if e.onChange != nil {
			e.onChange()
		}
		return eng, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(engine.Engine), nil
}

// served notes that a request for model id (canonical or wire id) ended
// on this node, for the model's memory estimate (modelMemory.served).
func (e *engines) served(id string) {
	if e == nil || !e.mem.pending() {
		return
	}
	if m, err := e.store.Get(id); err == nil {
		e.mem.served(m.ID)
	}
}

func (e *engines) isWarm(id string) bool {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.loaded[id] != nil
}

func (e *engines) warmIDs() []string {
	e.mu.RLock()
	defer e.mu.RUnlock()
	out := make([]string, 0, len(e.loaded))
	for id := range e.loaded {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

func (e *engines) close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for id, eng := range e.loaded {
		if err := eng.Close(); err != nil {
			e.log.Warn("close engine", "id", id, "err", err)
		}
	}
	e.loaded = map[string]engine.Engine{}
	if e.rt != nil {
		e.rt.Close()
		e.rt = nil
	}
	if e.llama != nil {
		e.llama.Close()
		e.llama = nil
	}
}
