package vision

import (
	"context"
	"errors"
	"fmt"
	"image"
	"math"
	"path/filepath"
	"sync"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx"
)

// SCRFD (insightface det_10g / det_500m) and ArcFace / MobileFaceNet
// (insightface w600k_r50 / w600k_mbf) conventions.
const (
	scrfdSize = 640
	// DefaultSCRFDThreshold and DefaultSCRFDNMS are insightface's defaults.
	DefaultSCRFDThreshold = 0.5
	DefaultSCRFDNMS       = 0.4
	arcSize               = 112
	arcBatch              = 8
)

// arcTemplate is insightface's arcface_src: where the eyes, nose tip and
// mouth corners of a 112 x 112 aligned face lie.
var arcTemplate = [5][2]float64{
	{38.2946, 51.6963}, {73.5318, 51.5014}, {56.0252, 71.7366}, {41.5493, 92.3655}, {70.7299, 92.2041},
}

// scrfd is the SCRFD + ArcFace face pipeline: the image is scaled to fit
// S x S keeping its aspect and placed at the top-left of a black canvas,
// (v-127.5)/128 RGB; for each stride (8, 16, 32, or five strides) the
// network gives per-anchor scores, box distances and five keypoints in
// stride units around anchor centres (x*s, y*s); boxes above the threshold
// go through greedy NMS and are scaled back. Embeddings: each face is
// warped by the similarity transform that takes its five keypoints onto
// the ArcFace template, 112 x 112, (v-127.5)/127.5 RGB, and the output
// vector is L2-normalised.
type scrfd struct {
	id         string
	size       int
	threshold  float32
	nms        float32
	det        *dynModel
	strides    []int
	anchorsPer int
	kps        bool
	emb        *dynModel // nil without an embedder
	embDim     int
	embBatch   int
	done       chan struct{}
	once       sync.Once
	err        error
}

// LoadSCRFD loads an insightface SCRFD detector (spec.Files["detector"]:
// one input f32[1,3,S,S]; 6, 9, 10 or 15 outputs in insightface's order —
// scores, box distances, then keypoints, per stride, [N,k] or [1,N,k]) and
// optionally an ArcFace/MobileFaceNet embedder (spec.Files["embedder"]: one
// input f32[N,3,112,112], one output f32[N,D]). Options: input_size S
// (640), confidence_threshold (0.5), nms_iou (0.4), concurrency (1),
// thread_spinning (off, as for BlazeFace; see spinning). LoadFaces calls it for a spec whose option "format" is "scrfd".
func LoadSCRFD(rt *onnx.Runtime, spec engine.Spec) (engine.FaceAnalyzer, error) {
	if err := checkTask(spec, engine.TaskFaceDetection); err != nil {
		return nil, err
	}
	rt, err := rt.ForModel(spec)
	if err != nil {
		return nil, err
	}
	f := &scrfd{id: spec.ID, done: make(chan struct{})}
	fail := func(err error) (engine.FaceAnalyzer, error) {
		f.Close()
		return nil, fmt.Errorf("vision: %s: %w", spec.ID, err)
	}
	if f.size, err = onnx.IntOption(spec.Options, "input_size", scrfdSize, 32, 2048); err != nil || f.size%32 != 0 {
		return fail(fmt.Errorf("option input_size: want a multiple of 32 (%v)", err))
	}
	var nRuns int
	if f.threshold, f.nms, nRuns, err = detectOptions(spec.Options, DefaultSCRFDThreshold, DefaultSCRFDNMS); err != nil {
		return fail(err)
	}
	spin, err := spinning(spec.Options, false)
	if err != nil {
		return fail(err)
	}
	if spec.Files["detector"] == "" {
		return fail(errors.New("spec names no \"detector\" file"))
	}
	path := filepath.Join(spec.Dir, spec.Files["detector"])
	in, outs, err := fileIO(path)
	if err != nil {
		return fail(err)
	}
	if len(in) != 1 {
		return fail(fmt.Errorf("detector has %d inputs, want 1", len(in)))
	}
	switch len(outs) {
	case 6, 9:
		f.strides, f.anchorsPer = []int{8, 16, 32}, 2
	case 10, 15:
		f.strides, f.anchorsPer = []int{8, 16, 32, 64, 128}, 1
	default:
		return fail(fmt.Errorf("detector has %d outputs, want 6, 9, 10 or 15", len(outs)))
	}
	f.kps = len(outs) == 9 || len(outs) == 15
	s := int64(f.size)
	outSpecs := make([]ioSpec, len(outs))
	for i, o := range outs {
		outSpecs[i] = ioSpec{name: o, dtype: ort.TensorElementDataTypeFloat}
	}
	if f.det, err = openDynModel(rt, spec.ID, path, []ioSpec{f32(in[0], 1, 3, s, s)}, outSpecs, nRuns, spin); err != nil {
		return fail(fmt.Errorf("detector: %w", err))
	}
	if name := spec.Files["embedder"]; name != "" {
		if !f.kps {
			return fail(errors.New("an embedder needs a detector with keypoints"))
		}
		epath := filepath.Join(spec.Dir, name)
		ein, eout, err := fileIO(epath)
		if err != nil {
			return fail(err)
		}
		if len(ein) != 1 || len(eout) < 1 {
			return fail(fmt.Errorf("embedder has %d inputs and %d outputs, want 1 and 1", len(ein), len(eout)))
		}
		dim, batch, err := embedderShape(epath)
		if err != nil {
			return fail(err)
		}
		f.embDim, f.embBatch = dim, batch
		if f.emb, err = openDynModel(rt, spec.ID, epath, []ioSpec{f32(ein[0], -1, 3, arcSize, arcSize)},
			[]ioSpec{f32(eout[0], -1, int64(dim))}, nRuns, spin); err != nil {
			return fail(fmt.Errorf("embedder: %w", err))
		}
	}
	return f, nil
}

// fileIO lists a model's input and output names in the file's order.
func fileIO(path string) ([]string, []string, error) {
	fin, fout, err := onnx.ReadSignature(path)
	if err != nil {
		return nil, nil, fmt.Errorf("read model signature of %s: %w", path, err)
	}
	var in, out []string
	for _, i := range fin {
		in = append(in, i.Name)
	}
	for _, o := range fout {
		out = append(out, o.Name)
	}
	return in, out, nil
}

// embedderShape reads the embedding size and the largest batch (1 when the
// file fixes the batch axis to 1) from the embedder's first output and input.
func embedderShape(path string) (int, int, error) {
	fin, fout, err := onnx.ReadSignature(path)
	if err != nil {
		return 0, 0, err
	}
	d := fout[0].Dimensions
	if len(d) != 2 || d[1] <= 0 {
		return 0, 0, fmt.Errorf("embedder output %q has shape %v, want [N, D]", fout[0].Name, d)
	}
	batch := arcBatch
	if b := fin[0].Dimensions; len(b) > 0 && b[0] > 0 {
		batch = int(b[0])
	}
	return int(d[1]), batch, nil
}

// ID returns the canonical model id.
func (f *scrfd) ID() string { return f.id }

// EmbeddingDim is the embedder's output size (0 without one).
func (f *scrfd) EmbeddingDim() int { return f.embDim }

// scrfdFace is one decoded face in image pixels.
type scrfdFace struct {
	score float32
	box   [4]float32 // x1, y1, x2, y2
	kps   [][2]float32
}

// Faces finds the faces in req.Image, best first, with five landmarks (eye
// on the image's left, the other eye, nose tip, mouth corners left and
// right) and, when asked, L2-normalised embeddings.
func (f *scrfd) Faces(ctx context.Context, req engine.FaceRequest) ([]engine.Face, error) {
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
	src := toRGBA(req.Image)
	w, h := src.Rect.Dx(), src.Rect.Dy()
	// insightface: fit into S x S keeping the aspect, at the top-left.
	nw, nh := f.size, int(float64(f.size)*float64(h)/float64(w))
	if float64(h)/float64(w) > 1 {
		nh, nw = f.size, int(float64(f.size)*float64(w)/float64(h))
	}
	nw, nh = max(nw, 1), max(nh, 1)
	scale := float64(nh) / float64(h)
	in := make([]float32, 3*f.size*f.size)
	fillLetterbox(src, letterbox{r: scale, newW: nw, newH: nh}, f.size, 0, 1, in)
	for i := range in {
		in[i] = (in[i] - 127.5) / 128
	}
	t, err := ort.NewTensor(ort.NewShape(1, 3, int64(f.size), int64(f.size)), in)
	if err != nil {
		return nil, err
	}
	outs, err := f.det.run(ctx, f.done, []ort.Value{t})
	t.Destroy()
	if err != nil {
		return nil, err
	}
	raw, err := f.decode(outs, thr, float32(scale))
	destroyAll(outs)
	if err != nil {
		return nil, err
	}
	raw = nmsFaces(raw, f.nms, maxResults)
	out := make([]engine.Face, 0, len(raw))
	var kept []scrfdFace
	for _, r := range raw {
		box, ok := clipBox(r.box[0], r.box[1], r.box[2], r.box[3], float32(w), float32(h))
		if !ok {
			continue
		}
		out = append(out, engine.Face{Confidence: r.score, Box: box, Landmarks: r.kps})
		kept = append(kept, r)
	}
	if req.Embeddings {
		for start := 0; start < len(kept); start += f.embBatch {
			end := min(start+f.embBatch, len(kept))
			vecs, err := f.embed(ctx, src, kept[start:end])
			if err != nil {
				return nil, err
			}
			for i, v := range vecs {
				out[start+i].Embedding = v
			}
		}
	}
	return out, nil
}

// decode reads every stride's scores, distances and keypoints; coordinates
// are divided by scale (the resize factor) to image pixels.
func (f *scrfd) decode(outs []ort.Value, thr, scale float32) ([]scrfdFace, error) {
	n := len(f.strides)
	var faces []scrfdFace
	for i, s := range f.strides {
		g := f.size / s
		count := g * g * f.anchorsPer
		scores, err := strideOutput(outs[i], count, 1)
		if err != nil {
			return nil, fmt.Errorf("vision: %s: stride %d scores: %w", f.id, s, err)
		}
		dist, err := strideOutput(outs[n+i], count, 4)
		if err != nil {
			return nil, fmt.Errorf("vision: %s: stride %d boxes: %w", f.id, s, err)
		}
		var kps []float32
		if f.kps {
			if kps, err = strideOutput(outs[2*n+i], count, 10); err != nil {
				return nil, fmt.Errorf("vision: %s: stride %d keypoints: %w", f.id, s, err)
			}
		}
		sf := float32(s)
		for a := range count {
			if scores[a] < thr {
				continue
			}
			cell := a / f.anchorsPer
			cx, cy := float32(cell%g)*sf, float32(cell/g)*sf
			d := dist[4*a : 4*a+4]
			face := scrfdFace{score: scores[a], box: [4]float32{
				(cx - d[0]*sf) / scale, (cy - d[1]*sf) / scale, (cx + d[2]*sf) / scale, (cy + d[3]*sf) / scale}}
			if f.kps {
				k := kps[10*a : 10*a+10]
				for j := range 5 {
					face.kps = append(face.kps, [2]float32{(cx + k[2*j]*sf) / scale, (cy + k[2*j+1]*sf) / scale})
				}
			}
			faces = append(faces, face)
		}
	}
	byScoreDesc(faces, func(f scrfdFace) float32 { return f.score })
	if len(faces) > maxCandidates {
		faces = faces[:maxCandidates]
	}
	return faces, nil
}

// strideOutput checks that v holds count rows of k floats ([count,k] or
// [1,count,k]) and returns them.
func strideOutput(v ort.Value, count, k int) ([]float32, error) {
	data, shape, err := floats(v)
	if err != nil {
		return nil, err
	}
	if len(data) != count*k || shape[len(shape)-1] != int64(k) {
		return nil, fmt.Errorf("shape %v, want %d rows of %d", shape, count, k)
	}
	return data, nil
}

// nmsFaces is greedy NMS over faces sorted best first.
func nmsFaces(faces []scrfdFace, iou float32, limit int) []scrfdFace {
	var keep []scrfdFace
	for _, c := range faces {
		if len(keep) == limit {
			break
		}
		ok := true
		for _, k := range keep {
			if boxIoU(k.box, c.box) > iou {
				ok = false
				break
			}
		}
		if ok {
			keep = append(keep, c)
		}
	}
	return keep
}

// similarity returns the 2x3 matrix [a -b tx; b a ty] of the least-squares
// similarity transform (rotation, uniform scale, translation; Umeyama
// without reflection) taking the points src onto dst.
func similarity(src [][2]float32, dst [5][2]float64) [6]float64 {
	n := float64(len(src))
	var msx, msy, mdx, mdy float64
	for i, p := range src {
		msx += float64(p[0]) / n
		msy += float64(p[1]) / n
		mdx += dst[i][0] / n
		mdy += dst[i][1] / n
	}
	var num1, num2, den float64
	for i, p := range src {
		sx, sy := float64(p[0])-msx, float64(p[1])-msy
		dx, dy := dst[i][0]-mdx, dst[i][1]-mdy
		num1 += sx*dx + sy*dy
		num2 += sx*dy - sy*dx
		den += sx*sx + sy*sy
	}
	if den == 0 {
		return [6]float64{1, 0, mdx - msx, 0, 1, mdy - msy}
	}
	a, b := num1/den, num2/den
	return [6]float64{a, -b, mdx - (a*msx - b*msy), b, a, mdy - (b*msx + a*msy)}
}

// alignFace warps src by the similarity taking kps onto the ArcFace
// template into a 112 x 112 planar RGB crop of (v-127.5)/127.5, as
// cv2.warpAffine does (bilinear, pixel centres at integer coordinates,
// black outside the image).
func alignFace(src *image.RGBA, kps [][2]float32, dst []float32) {
	m := similarity(kps, arcTemplate)
	// Invert [a -b; b a].
	a, b := m[0], m[3]
	det := a*a + b*b
	ia, ib := a/det, -b/det
	w, h := src.Rect.Dx(), src.Rect.Dy()
	at := func(x, y int) (float32, float32, float32) {
		if x < 0 || y < 0 || x >= w || y >= h {
			return 0, 0, 0
		}
		p := src.Pix[y*src.Stride+4*x:]
		return float32(p[0]), float32(p[1]), float32(p[2])
	}
	plane := arcSize * arcSize
	for j := range arcSize {
		for i := range arcSize {
			u, v := float64(i)-m[2], float64(j)-m[5]
			x := ia*u - ib*v
			y := ib*u + ia*v
			x0, y0 := int(math.Floor(x)), int(math.Floor(y))
			fx, fy := float32(x-float64(x0)), float32(y-float64(y0))
			r00, g00, b00 := at(x0, y0)
			r10, g10, b10 := at(x0+1, y0)
			r01, g01, b01 := at(x0, y0+1)
			r11, g11, b11 := at(x0+1, y0+1)
			o := j*arcSize + i
			dst[o] = (bilerp(r00, r10, r01, r11, fx, fy) - 127.5) / 127.5
			dst[plane+o] = (bilerp(g00, g10, g01, g11, fx, fy) - 127.5) / 127.5
			dst[2*plane+o] = (bilerp(b00, b10, b01, b11, fx, fy) - 127.5) / 127.5
		}
	}
}

// embed aligns and embeds faces (at most embBatch) in one run.
func (f *scrfd) embed(ctx context.Context, src *image.RGBA, faces []scrfdFace) ([][]float32, error) {
	per := 3 * arcSize * arcSize
	in := make([]float32, len(faces)*per)
	for i, fc := range faces {
		alignFace(src, fc.kps, in[i*per:(i+1)*per])
	}
	t, err := ort.NewTensor(ort.NewShape(int64(len(faces)), 3, arcSize, arcSize), in)
	if err != nil {
		return nil, err
	}
	defer t.Destroy()
	outs, err := f.emb.run(ctx, f.done, []ort.Value{t})
	if err != nil {
		return nil, err
	}
	defer destroyAll(outs)
	data, shape, err := floats(outs[0])
	if err != nil || len(data) != len(faces)*f.embDim {
		return nil, fmt.Errorf("vision: %s: embedder output %v: %v", f.id, shape, err)
	}
	vecs := make([][]float32, len(faces))
	for i := range faces {
		vecs[i] = normalize(data[i*f.embDim : (i+1)*f.embDim])
	}
	return vecs, nil
}

// Close waits for runs in flight, then releases the sessions.
func (f *scrfd) Close() error {
	f.once.Do(func() {
		close(f.done)
		var errs []error
		for _, m := range []*dynModel{f.det, f.emb} {
			if m != nil {
				errs = append(errs, m.close())
			}
		}
		f.err = errors.Join(errs...)
	})
	return f.err
}
