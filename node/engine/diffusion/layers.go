package diffusion

import (
	"context"
	"image"
	"sort"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/infermesh/infermesh/node/engine"
)

// segmenter returns the engine's own background remover, else the one the
// node passed with the job.
func (e *Engine) segmenter(job *engine.ImageJob) (engine.BackgroundRemover, error) {
	if e.seg != nil {
		return e.seg, nil
	}
	if job.Segmenter != nil {
		return job.Segmenter, nil
	}
	return nil, inputErr("operation", "Model %s has no background remover (segmenter) and the node has none installed; operation '%s' needs one.", e.id, job.Operation)
}

// removeBackground returns the picture with its background transparent.
func (e *Engine) removeBackground(ctx context.Context, job *engine.ImageJob) ([]*image.NRGBA, error) {
	seg, err := e.segmenter(job)
	if err != nil {
		return nil, err
	}
	out, err := seg.RemoveBackground(ctx, job.Image)
	if err != nil {
		return nil, err
	}
	return []*image.NRGBA{out}, nil
}

// layers splits the picture into job.LayerCount RGBA layers, bottom first,
// that recompose (alpha "over", in order) to the picture: layer 0 is the
// opaque background, where the pixels the foreground covers fully are
// repainted by the model when it can inpaint; the others hold the
// foreground's connected regions, largest first, the last one taking the
// rest (a layer without a region is fully transparent). Pixels the
// foreground covers only in part keep the picture in the background
// layer, so the recomposition is exact up to 8-bit rounding.
func (e *Engine) layers(ctx context.Context, ro *ort.RunOptions, job *engine.ImageJob, seed int64) ([]*image.NRGBA, error) {
	k := job.LayerCount
	if k == 0 {
		k = 2
	}
	src := toNRGBA(job.Image)
	for i := 3; i < len(src.Pix); i += 4 {
		src.Pix[i] = 0xff
	}
	if k == 1 {
		return []*image.NRGBA{src}, nil
	}
	seg, err := e.segmenter(job)
	if err != nil {
		return nil, err
	}
	fg, err := seg.RemoveBackground(ctx, src)
	if err != nil {
		return nil, err
	}
	w, h := src.Rect.Dx(), src.Rect.Dy()
	core := make([]float32, w*h)
	has := false
	for i := range core {
		if fg.Pix[4*i+3] == 0xff {
			core[i], has = 1, true
		}
	}
	bg := src
	if has && e.vaeEnc != nil && e.inChannels != 8 {
		fill := *job
		fill.Operation, fill.Mask, fill.N, fill.Width, fill.Height = engine.OpInpaint, maskImage(core, w, h), 1, 0, 0
		fill.ControlType, fill.ControlImage = "", nil
		if fill.Prompt == "" {
			fill.Prompt = "background"
		}
		imgs, err := e.diffuse(ctx, ro, &fill, seed)
		if err != nil {
			return nil, err
		}
		bg = imgs[0]
	}
	out := []*image.NRGBA{bg}
	regions := components(fg, w, h)
	for j := 1; j < k; j++ {
		l := image.NewNRGBA(src.Rect)
		var ids [][]int
		switch {
		case j < k-1 && j-1 < len(regions):
			ids = regions[j-1 : j]
		case j == k-1 && j-1 < len(regions):
			ids = regions[j-1:]
		}
		for _, id := range ids {
			for _, p := range id {
				copy(l.Pix[4*p:4*p+4], fg.Pix[4*p:4*p+4])
			}
		}
		out = append(out, l)
	}
	return out, nil
}

// maskImage turns a 0/1 mask into a black and white picture.
func maskImage(m []float32, w, h int) *image.Gray {
	g := image.NewGray(image.Rect(0, 0, w, h))
	for i, v := range m {
		if v > 0 {
			g.Pix[i] = 0xff
		}
	}
	return g
}

// components returns the 8-connected regions of fg's visible pixels
// (alpha > 0) as pixel index lists, largest first.
func components(fg *image.NRGBA, w, h int) [][]int {
	seen := make([]bool, w*h)
	var regions [][]int
	for start := range seen {
		if seen[start] || fg.Pix[4*start+3] == 0 {
			continue
		}
		seen[start] = true
		region := []int{start}
		for q := 0; q < len(region); q++ {
			x, y := region[q]%w, region[q]/w
			for dy := -1; dy <= 1; dy++ {
				for dx := -1; dx <= 1; dx++ {
					nx, ny := x+dx, y+dy
					if nx < 0 || ny < 0 || nx >= w || ny >= h {
						continue
					}
					j := ny*w + nx
					if !seen[j] && fg.Pix[4*j+3] > 0 {
						seen[j] = true
						region = append(region, j)
					}
				}
			}
		}
		regions = append(regions, region)
	}
	sort.SliceStable(regions, func(a, b int) bool { return len(regions[a]) > len(regions[b]) })
	return regions
}
