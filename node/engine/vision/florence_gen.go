package vision

import (
	"context"
	"fmt"
	"image"

	ort "github.com/yalue/onnxruntime_go"
)

// Florence-2 generation: image and prompt encoding, then greedy decoding
// with the merged decoder's KV cache.

// generate encodes img with prompt and decodes at most maxNew tokens. It
// returns the generated ids (the decoder start token excluded, the EOS
// included when reached) and whether EOS ended the generation.
func (f *florence) generate(ctx context.Context, img image.Image, prompt string, maxNew int) ([]int64, bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	select {
	case <-f.done:
		return nil, false, errClosed
	default:
	}
	hidden, seq, err := f.encode(ctx, img, prompt)
	if err != nil {
		return nil, false, err
	}
	defer hidden.Destroy()
	mask := make([]int64, seq)
	for i := range mask {
		mask[i] = 1
	}
	maskT, err := ort.NewTensor(ort.NewShape(1, int64(seq)), mask)
	if err != nil {
		return nil, false, err
	}
	defer maskT.Destroy()

	// past holds, per layer, decoder key, decoder value, encoder key,
	// encoder value (the present outputs of the previous step).
	past := make([]ort.Value, 4*f.layers)
	defer func() { destroyAll(past) }()
	empty := make([]float32, 0)
	for i := range past {
		v, err := ort.NewTensor(ort.NewShape(1, int64(f.heads), 0, int64(f.headDim)), empty)
		if err != nil {
			return nil, false, err
		}
		past[i] = v
	}
	var out []int64
	token := f.start
	for step := 0; step < maxNew; step++ {
		embeds, err := f.embedIDs(ctx, []int64{token})
		if err != nil {
			return nil, false, err
		}
		branch, err := ort.NewTensor(ort.NewShape(1), []bool{step > 0})
		if err != nil {
			embeds.Destroy()
			return nil, false, err
		}
		inputs := append([]ort.Value{maskT, hidden, embeds, branch}, past...)
		outs, err := f.dec.run(ctx, f.done, inputs)
		embeds.Destroy()
		branch.Destroy()
		if err != nil {
			return nil, false, err
		}
		logits, shape, err := floats(outs[0])
		if err != nil || len(shape) != 3 || shape[1] != 1 {
			destroyAll(outs)
			return nil, false, fmt.Errorf("vision: %s: decoder logits %v: %v", f.id, shape, err)
		}
		next := f.pick(logits, out, step)
		outs[0].Destroy()
		// Keep the decoder's new self-attention cache; the cross-attention
		// cache of the first step is kept for good (later steps pass it
		// through).
		for l := range f.layers {
			for k := range 4 {
				i := 4*l + k
				if k < 2 || step == 0 {
					past[i].Destroy()
					past[i] = outs[1+i]
				} else {
					outs[1+i].Destroy()
				}
			}
		}
		out = append(out, next)
		if next == f.eos {
			return out, true, nil
		}
		token = next
	}
	return out, false, nil
}

// pick returns the next token: the forced BOS at the first step, else the
// highest logit among the tokens no_repeat_ngram_size allows.
func (f *florence) pick(logits []float32, prev []int64, step int) int64 {
	if step == 0 && f.forcedBOS >= 0 && int(f.forcedBOS) < len(logits) {
		return f.forcedBOS
	}
	banned := map[int64]bool{}
	if n := f.noRepeat; n > 0 && len(prev) >= n {
		// Tokens that would repeat an n-gram: those that followed an
		// earlier occurrence of the last n-1 tokens.
		tail := prev[len(prev)-n+1:]
		for i := 0; i+n <= len(prev); i++ {
			match := true
			for j := range tail {
				if prev[i+j] != tail[j] {
					match = false
					break
				}
			}
			if match {
				banned[prev[i+n-1]] = true
			}
		}
	}
	best := int64(-1)
	for i, v := range logits {
		if banned[int64(i)] {
			continue
		}
		if best < 0 || v > logits[best] {
			best = int64(i)
		}
	}
	if best < 0 {
		return f.eos
	}
	return best
}

// encode runs the vision encoder on img, puts the image features before the
// embedded prompt and runs the BART encoder; it returns the encoder's
// hidden states and their length.
func (f *florence) encode(ctx context.Context, img image.Image, prompt string) (ort.Value, int, error) {
	src := toRGBA(img)
	s := f.size
	rgb := make([]float32, s*s*3)
	resampleWindow(src, 0, 0, float64(src.Rect.Dx()), float64(src.Rect.Dy()), s, s, rgb, 1, 0)
	mean := [3]float32{0.485, 0.456, 0.406}
	std := [3]float32{0.229, 0.224, 0.225}
	px := make([]float32, len(rgb))
	for i := range s * s {
		for c := range 3 {
			px[c*s*s+i] = (rgb[3*i+c]/255 - mean[c]) / std[c]
		}
	}
	pxT, err := ort.NewTensor(ort.NewShape(1, 3, int64(s), int64(s)), px)
	if err != nil {
		return nil, 0, err
	}
	vis, err := f.vision.run(ctx, f.done, []ort.Value{pxT})
	pxT.Destroy()
	if err != nil {
		return nil, 0, err
	}
	defer destroyAll(vis)
	imgFeat, imgShape, err := floats(vis[0])
	if err != nil || len(imgShape) != 3 {
		return nil, 0, fmt.Errorf("vision: %s: image features %v: %v", f.id, imgShape, err)
	}
	enc, err := f.tok.Encode(prompt, 0)
	if err != nil {
		return nil, 0, err
	}
	txt, err := f.embedIDs(ctx, enc.IDs)
	if err != nil {
		return nil, 0, err
	}
	defer txt.Destroy()
	txtFeat, txtShape, err := floats(txt)
	if err != nil || len(txtShape) != 3 || txtShape[2] != imgShape[2] {
		return nil, 0, fmt.Errorf("vision: %s: prompt embeddings %v vs image features %v: %v", f.id, txtShape, imgShape, err)
	}
	seq := int(imgShape[1] + txtShape[1])
	joined := append(append(make([]float32, 0, len(imgFeat)+len(txtFeat)), imgFeat...), txtFeat...)
	mask := make([]int64, seq)
	for i := range mask {
		mask[i] = 1
	}
	jT, err := ort.NewTensor(ort.NewShape(1, int64(seq), imgShape[2]), joined)
	if err != nil {
		return nil, 0, err
	}
	defer jT.Destroy()
	mT, err := ort.NewTensor(ort.NewShape(1, int64(seq)), mask)
	if err != nil {
		return nil, 0, err
	}
	defer mT.Destroy()
	hs, err := f.enc.run(ctx, f.done, []ort.Value{jT, mT})
	if err != nil {
		return nil, 0, err
	}
	return hs[0], seq, nil
}

// embedIDs runs embed_tokens on ids; the caller destroys the result.
func (f *florence) embedIDs(ctx context.Context, ids []int64) (ort.Value, error) {
	t, err := ort.NewTensor(ort.NewShape(1, int64(len(ids))), ids)
	if err != nil {
		return nil, err
	}
	defer t.Destroy()
	outs, err := f.embed.run(ctx, f.done, []ort.Value{t})
	if err != nil {
		return nil, err
	}
	return outs[0], nil
}
