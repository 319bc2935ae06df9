package vision

import (
	"context"
	"errors"
	"fmt"
	"image"
	"math"
	"path/filepath"
	"sync"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx"
)

// BlazeFace and FaceRes model signatures and defaults.
const (
	blazeInput     = "input:0"      // f32[1,N,N,3], RGB scaled to [-1, 1]
	blazeScores16  = "Identity:0"   // f32[1,512,1] logits, 16x16 cells x 2 anchors
	blazeScores8   = "Identity_1:0" // f32[1,384,1] logits, 8x8 cells x 6 anchors
	blazeRegress16 = "Identity_2:0" // f32[1,512,16] box and keypoint offsets
	blazeRegress8  = "Identity_3:0" // f32[1,384,16]
	blazeSize      = 256
	blazeKeypoints = 6

	faceResInput = "input_1"             // f32[B,224,224,3], RGB 0..255
	faceResEmbed = "global_pooling/Mean" // f32[B,1024]
	faceResSize  = 224
	faceResDim   = 1024
	// faceResBatch is the most face crops one embedder run takes.
	faceResBatch = 8

	// DefaultFaceThreshold is the BlazeFace engine's confidence threshold
	// when neither the request nor the manifest sets one.
	DefaultFaceThreshold = 0.5
	// DefaultFaceNMS is the IoU at which overlapping face boxes are
	// merged (MediaPipe's weighted NMS).
	DefaultFaceNMS = 0.3
	// DefaultCropScale is the side of the square face crop given to the
	// embedder, relative to the larger side of the face box.
	DefaultCropScale = 1.3
	// maxFaceCandidates bounds the anchors that enter weighted NMS.
	maxFaceCandidates = 896
)

// faces is the BlazeFace + FaceRes pipeline. The image is letterboxed (black
// bars, centred) to an N x N square for BlazeFace; every anchor above the
// threshold gives a box and six keypoints, and MediaPipe's weighted NMS blends
// overlapping ones. For embeddings each face is cut as a square of
// crop_scale times its box's larger side around the box centre, rotated so
// that the eyes are level, resized to 224 x 224 for FaceRes, and the
// 1024-D descriptor is L2-normalised.
type faces struct {
	id        string
	size      int
	anchors   [][2]float32
	threshold float32
	nms       float32
	cropScale float64
	det, emb  *model // emb is nil without an "embedder" file
	done      chan struct{}
	once      sync.Once
	err       error
}

// LoadFaces loads a BlazeFace face detector (spec.Files["detector"]; input
// input:0 f32[1,N,N,3] in [-1, 1], score and regressor outputs Identity:0
// to Identity_3:0 for 896 anchors) and, when spec.Files["embedder"] is set,
// the HSE FaceRes descriptor (input input_1 f32[B,224,224,3] RGB 0..255,
// output global_pooling/Mean f32[B,1024]). Options: input_size N (128 or
// 256, default 256), confidence_threshold (default 0.5), nms_iou (default
// 0.3), crop_scale (default 1.3) and concurrency, the number of
// simultaneous runs per model (default 1), and thread_spinning (on or off,
// default off; see spinning). Option "format" selects the
// networks: "blazeface" (the default) or "scrfd" (SCRFD with an optional
// ArcFace/MobileFaceNet embedder, see LoadSCRFD).
func LoadFaces(rt *onnx.Runtime, spec engine.Spec) (engine.FaceAnalyzer, error) {
	if err := checkTask(spec, engine.TaskFaceDetection); err != nil {
		return nil, err
	}
	rt, err := rt.ForModel(spec)
	if err != nil {
		return nil, err
	}
	switch f := spec.Options["format"]; f {
	case "", "blazeface":
	case "scrfd":
		return LoadSCRFD(rt, spec)
	default:
		return nil, fmt.Errorf("vision: %s: option format=%q: want blazeface or scrfd", spec.ID, f)
	}
	f, nSlots, err := newFacesConfig(spec)
	if err != nil {
		return nil, fmt.Errorf("vision: %s: %w", spec.ID, err)
	}
	name := spec.Files["detector"]
	if name == "" {
		return nil, fmt.Errorf("vision: %s: spec names no \"detector\" file", spec.ID)
	}
	spin, err := spinning(spec.Options, false)
	if err != nil {
		return nil, fmt.Errorf("vision: %s: %w", spec.ID, err)
	}
	n := int64(f.size)
	f.det, err = openModel(rt, spec.ID, filepath.Join(spec.Dir, name),
		[]tensorSpec{{blazeInput, []int64{1, n, n, 3}}},
		[]tensorSpec{
			{blazeScores16, []int64{1, 512, 1}}, {blazeScores8, []int64{1, 384, 1}},
			{blazeRegress16, []int64{1, 512, 16}}, {blazeRegress8, []int64{1, 384, 16}},
		}, 1, nSlots, spin)
	if err != nil {
		return nil, fmt.Errorf("vision: %s: detector: %w", spec.ID, err)
	}
	if name := spec.Files["embedder"]; name != "" {
		f.emb, err = openModel(rt, spec.ID, filepath.Join(spec.Dir, name),
			[]tensorSpec{{faceResInput, []int64{1, faceResSize, faceResSize, 3}}},
			[]tensorSpec{{faceResEmbed, []int64{1, faceResDim}}}, faceResBatch, nSlots, spin)
		if err != nil {
			f.det.close()
			return nil, fmt.Errorf("vision: %s: embedder: %w", spec.ID, err)
		}
	}
	return f, nil
}

func newFacesConfig(spec engine.Spec) (*faces, int, error) {
	size, err := onnx.IntOption(spec.Options, "input_size", blazeSize, 128, 256)
	if err != nil {
		return nil, 0, err
	}
	if size != 128 && size != 256 {
		return nil, 0, fmt.Errorf("option input_size=%d: want 128 or 256", size)
	}
	thr, nms, nSlots, err := detectOptions(spec.Options, DefaultFaceThreshold, DefaultFaceNMS)
	if err != nil {
		return nil, 0, err
	}
	crop, err := floatOption(spec.Options, "crop_scale", DefaultCropScale, 0.5, 4)
	if err != nil {
		return nil, 0, err
	}
	return &faces{
		id:        spec.ID,
		size:      size,
		anchors:   blazeAnchors(),
		threshold: thr,
		nms:       nms,
		cropScale: crop,
		done:      make(chan struct{}),
	}, nSlots, nil
}

// blazeAnchors returns the 896 anchor centres in unit coordinates: 16x16
// cells with 2 anchors each, then 8x8 cells with 6, row-major with the
// anchor index changing fastest (MediaPipe's SSD anchors for BlazeFace, all
// of size 1).
func blazeAnchors() [][2]float32 {
	a := make([][2]float32, 0, 896)
	for _, l := range []struct{ grid, per int }{{16, 2}, {8, 6}} {
		for y := range l.grid {
			for x := range l.grid {
				for range l.per {
					a = append(a, [2]float32{(float32(x) + 0.5) / float32(l.grid), (float32(y) + 0.5) / float32(l.grid)})
				}
			}
		}
	}
	return a
}

// ID returns the canonical model id.
func (f *faces) ID() string { return f.id }

// EmbeddingDim is 1024 with the FaceRes embedder, 0 without one.
func (f *faces) EmbeddingDim() int {
	if f.emb == nil {
		return 0
	}
	return faceResDim
}

// rawFace is one decoded face in unit letterbox coordinates: box x1, y1,
// x2, y2 and keypoints.
type rawFace struct {
	score float32
	box   [4]float32
	kp    [blazeKeypoints][2]float32
}

// Faces finds the faces in req.Image, best first, with boxes clipped to the
// image and, when asked, L2-normalised embeddings. Cancelling ctx abandons
// the call while it waits for a run slot and stops a run in progress.
func (f *faces) Faces(ctx context.Context, req engine.FaceRequest) ([]engine.Face, error) {
	thr, maxResults, err := limits(req.Image, req.ConfidenceThreshold, req.MaxResults, f.threshold)
	if err != nil {
		return nil, err
	}
	if req.Embeddings && f.emb == nil {
		return nil, &engine.InputError{Param: "return_embeddings", Msg: "model " + f.id + " has no face embedder"}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	select {
	case <-f.done:
		return nil, errClosed
	default:
	}
	w, h := req.Image.Bounds().Dx(), req.Image.Bounds().Dy()
	side := float32(max(w, h))
	ox, oy := float32(w-max(w, h))/2, float32(h-max(w, h))/2 // letterbox origin (<= 0)
	s, img, err := f.det.acquireFor(ctx, f.done, req.Image)
	if err != nil {
		return nil, err
	}
	src, err := resampleImage(img, float64(ox), float64(oy), float64(side), float64(side), f.size, f.size, s.in[0], 1/127.5, -1)
	if err == nil {
		err = f.det.run(ctx, s, 1)
	}
	var raw []rawFace
	if err == nil {
		raw = f.decode(s.out, thr)
	}
	f.det.release(s)
	if err != nil {
		return nil, err
	}
	raw = weightedNMS(raw, f.nms, maxResults)
	out := make([]engine.Face, 0, len(raw))
	kept := make([]rawFace, 0, len(raw))
	for _, r := range raw {
		// Unit letterbox coordinates to image pixels.
		px := func(p [2]float32) [2]float32 { return [2]float32{p[0]*side + ox, p[1]*side + oy} }
		a, b := px([2]float32{r.box[0], r.box[1]}), px([2]float32{r.box[2], r.box[3]})
		box, ok := clipBox(a[0], a[1], b[0], b[1], float32(w), float32(h))
		if !ok {
			continue
		}
		face := engine.Face{Confidence: r.score, Box: box, Landmarks: make([][2]float32, blazeKeypoints)}
		for k, p := range r.kp {
			face.Landmarks[k] = px(p)
		}
		r.box = [4]float32{a[0], a[1], b[0], b[1]}
		out = append(out, face)
		kept = append(kept, r)
	}
	if req.Embeddings && len(out) > 0 {
		if err := f.embed(ctx, src, out, kept); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// TakesStreamedImages reports that Faces takes a picture still being
// decoded (see resampleImage).
func (f *faces) TakesStreamedImages() bool { return true }

// decode turns the detector's outputs into faces scoring at least thr, best
// first (at most maxFaceCandidates).
func (f *faces) decode(outs [][]float32, thr float32) []rawFace {
	n := float32(f.size)
	var raw []rawFace
	for i, anchor := range f.anchors {
		logit, reg := outs[0], outs[2]
		j := i
		if i >= 512 {
			logit, reg, j = outs[1], outs[3], i-512
		}
		score := sigmoid(logit[j])
		if score < thr {
			continue
		}
		r := reg[16*j : 16*j+16]
		cx, cy := anchor[0]+r[0]/n, anchor[1]+r[1]/n
		bw, bh := r[2]/n, r[3]/n
		face := rawFace{score: score, box: [4]float32{cx - bw/2, cy - bh/2, cx + bw/2, cy + bh/2}}
		for k := range blazeKeypoints {
			face.kp[k] = [2]float32{anchor[0] + r[4+2*k]/n, anchor[1] + r[5+2*k]/n}
		}
		raw = append(raw, face)
	}
	byScoreDesc(raw, func(f rawFace) float32 { return f.score })
	if len(raw) > maxFaceCandidates {
		raw = raw[:maxFaceCandidates]
	}
	return raw
}

// sigmoid maps a logit to (0, 1), clamping it to +-100 as MediaPipe does.
func sigmoid(x float32) float32 {
	x = min(max(x, -100), 100)
	return float32(1 / (1 + math.Exp(-float64(x))))
}

// weightedNMS is MediaPipe's weighted non-maximum suppression: the best
// remaining face and every face overlapping it with IoU >= iou form a group,
// whose box and keypoints are the score-weighted mean of the group's and
// whose score is the best one's. Input sorted best first; at most limit
// faces come out.
func weightedNMS(raw []rawFace, iou float32, limit int) []rawFace {
	var out []rawFace
	used := make([]bool, len(raw))
	for i := range raw {
		if used[i] {
			continue
		}
		if len(out) == limit {
			break
		}
		var sum float32
		var merged rawFace
		merged.score = raw[i].score
		for j := i; j < len(raw); j++ {
			if used[j] || boxIoU(raw[i].box, raw[j].box) < iou {
				continue
			}
			used[j] = true
			wt := raw[j].score
			sum += wt
			for k := range merged.box {
				merged.box[k] += wt * raw[j].box[k]
			}
			for k := range merged.kp {
				merged.kp[k][0] += wt * raw[j].kp[k][0]
				merged.kp[k][1] += wt * raw[j].kp[k][1]
			}
		}
		for k := range merged.box {
			merged.box[k] /= sum
		}
		for k := range merged.kp {
			merged.kp[k][0] /= sum
			merged.kp[k][1] /= sum
		}
		out = append(out, merged)
	}
	return out
}

// embed sets each face's descriptor, computed from an eye-levelled square
// crop of img, faceResBatch crops per run. raw[i].box is face i's unclipped
// box (x1, y1, x2, y2) in image pixels; its eyes are out[i].Landmarks[0:2].
func (f *faces) embed(ctx context.Context, img *image.RGBA, out []engine.Face, raw []rawFace) error {
	per := faceResSize * faceResSize * 3
	for start := 0; start < len(out); start += faceResBatch {
		n := min(faceResBatch, len(out)-start)
		s, err := f.emb.acquire(ctx, f.done)
		if err != nil {
			return err
		}
		for i := range n {
			face, r := out[start+i], raw[start+i]
			cx, cy := float64(r.box[0]+r.box[2])/2, float64(r.box[1]+r.box[3])/2
			side := f.cropScale * float64(max(r.box[2]-r.box[0], r.box[3]-r.box[1]))
			// Keypoints 0 and 1 are the eyes; level the line between them.
			e0, e1 := face.Landmarks[0], face.Landmarks[1]
			angle := math.Atan2(float64(e1[1]-e0[1]), float64(e1[0]-e0[0]))
			rotatedCrop(img, cx, cy, side, angle, faceResSize, s.in[0][i*per:(i+1)*per], 1, 0)
		}
		err = f.emb.run(ctx, s, n)
		if err == nil {
			for i := range n {
				out[start+i].Embedding = normalize(s.out[0][i*faceResDim : (i+1)*faceResDim])
			}
		}
		f.emb.release(s)
		if err != nil {
			return err
		}
	}
	return nil
}

// normalize returns a copy of v scaled to unit L2 length.
func normalize(v []float32) []float32 {
	var ss float64
	for _, x := range v {
		ss += float64(x) * float64(x)
	}
	out := make([]float32, len(v))
	if ss == 0 {
		return out
	}
	inv := float32(1 / math.Sqrt(ss))
	for i, x := range v {
		out[i] = x * inv
	}
	return out
}

// Close waits for runs in flight, then releases both sessions. Calls that
// have not started a run fail once Close begins.
func (f *faces) Close() error {
	f.once.Do(func() {
		close(f.done)
		errs := []error{f.det.close()}
		if f.emb != nil {
			errs = append(errs, f.emb.close())
		}
		f.err = errors.Join(errs...)
	})
	return f.err
}
