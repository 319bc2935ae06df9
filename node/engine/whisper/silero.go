package whisper

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx"
)

// sileroState is the size of Silero VAD v4's LSTM state h and c [2,1,64].
const sileroState = 2 * 64

// VAD is a loaded Silero VAD v4 model. It implements engine.VoiceDetector.
// One session is shared by all streams (ONNX Runtime runs it concurrently
// with per-call tensors); each stream carries its own LSTM state.
type VAD struct {
	id    string
	frame int
	sess  *ort.DynamicAdvancedSession
	mu    sync.RWMutex // read by runs, written by Close
	close bool
}

// LoadVAD loads Silero VAD v4 (inputs input [1,N], sr, h, c; outputs
// output, hn, cn). spec.Files["model"] names the .onnx file;
// spec.Options "frame_samples" is 512, 1024 or 1536 (default 1536, 96 ms).
func LoadVAD(rt *onnx.Runtime, spec engine.Spec) (engine.VoiceDetector, error) {
	if spec.Task != "" && spec.Task != engine.TaskVoiceActivity {
		return nil, fmt.Errorf("whisper: %s: task %q is not %q", spec.ID, spec.Task, engine.TaskVoiceActivity)
	}
	rt, err := rt.ForModel(spec)
	if err != nil {
		return nil, err
	}
	frame := 1536
	if s := spec.Options["frame_samples"]; s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || (v != 512 && v != 1024 && v != 1536) {
			return nil, fmt.Errorf("whisper: %s: option frame_samples=%q: want 512, 1024 or 1536", spec.ID, s)
		}
		frame = v
	}
	if spec.Files["model"] == "" {
		return nil, fmt.Errorf("whisper: %s: spec names no \"model\" file", spec.ID)
	}
	path := filepath.Join(spec.Dir, spec.Files["model"])
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("whisper: %s: model file: %w", spec.ID, err)
	}
	opts, err := rt.SessionOptions()
	if err != nil {
		return nil, fmt.Errorf("whisper: %s: session options: %w", spec.ID, err)
	}
	defer opts.Destroy()
	sess, err := ort.NewDynamicAdvancedSession(path, []string{"input", "sr", "h", "c"}, []string{"output", "hn", "cn"}, opts)
	if err != nil {
		return nil, fmt.Errorf("whisper: %s: create session: %w", spec.ID, err)
	}
	return &VAD{id: spec.ID, frame: frame, sess: sess}, nil
}

// ID returns the canonical model id.
func (v *VAD) ID() string { return v.id }

// FrameSize is the number of 16 kHz samples ProcessFrame takes.
func (v *VAD) FrameSize() int { return v.frame }

// NewStream starts one audio stream's state.
func (v *VAD) NewStream() (engine.VoiceStream, error) {
	return &vadStream{v: v, h: make([]float32, sileroState), c: make([]float32, sileroState),
		out: make([]float32, 1), hn: make([]float32, sileroState), cn: make([]float32, sileroState)}, nil
}

// Close releases the session once running frames finish.
func (v *VAD) Close() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.close {
		return nil
	}
	v.close = true
	return v.sess.Destroy()
}

// vadStream is one stream's LSTM state.
type vadStream struct {
	v    *VAD
	h, c []float32
	out  []float32 // [1]
	hn   []float32 // [sileroState]
	cn   []float32 // [sileroState]
}

// ProcessFrame returns the speech probability of the next frame.
func (s *vadStream) ProcessFrame(ctx context.Context, samples []float32) (float32, error) {
	if len(samples) != s.v.frame {
		return 0, &engine.InputError{Param: "audio", Msg: fmt.Sprintf("a VAD frame is %d samples, got %d", s.v.frame, len(samples))}
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	var vals []ort.Value
	defer func() {
		for _, v := range vals {
			v.Destroy()
		}
	}()
	add := func(v ort.Value, err error) error {
		if err == nil {
			vals = append(vals, v)
		}
		return err
	}
	state := ort.NewShape(2, 1, 64)
	if err := add(ort.NewTensor(ort.NewShape(1, int64(len(samples))), samples)); err != nil {
		return 0, err
	}
	if err := add(ort.NewScalar(int64(engine.SpeechSampleRate))); err != nil {
		return 0, err
	}
	for _, b := range [][]float32{s.h, s.c} {
		if err := add(ort.NewTensor(state, b)); err != nil {
			return 0, err
		}
	}
	for _, b := range [][]float32{s.out, s.hn, s.cn} {
		shape := state
		if len(b) == 1 {
			shape = ort.NewShape(1, 1)
		}
		if err := add(ort.NewTensor(shape, b)); err != nil {
			return 0, err
		}
	}
	s.v.mu.RLock()
	defer s.v.mu.RUnlock()
	if s.v.close {
		return 0, errClosed
	}
	if err := s.v.sess.Run(vals[:4], vals[4:]); err != nil {
		return 0, fmt.Errorf("whisper: %s: run: %w", s.v.id, err)
	}
	copy(s.h, s.hn)
	copy(s.c, s.cn)
	return s.out[0], nil
}

// Reset clears the LSTM state.
func (s *vadStream) Reset() {
	clear(s.h)
	clear(s.c)
}

// Close releases the stream (it holds no native resources).
func (s *vadStream) Close() error { return nil }
