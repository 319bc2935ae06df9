package whisper

import (
	"context"
	"math"
	"sort"
	"strings"
	"unicode"

	"github.com/infermesh/infermesh/node/engine"
)

// medianWidth is the median filter over time applied to the alignment
// heads' attention (config median_filter_width).
const medianWidth = 7

// alignWords times the words of one window the way openai/whisper's
// find_alignment does: the window's text is fed again as [SOT sequence,
// <|notimestamps|>, text, EOT]; the cross-attention of the alignment heads
// over the window's audio frames is normalised per head over tokens,
// median-filtered over time and averaged; dynamic time warping over its
// negation gives each token's first frame, and a word spans from its first
// token's frame to the next word's.
func (e *Engine) alignWords(ctx context.Context, s *slot, res windowResult, segs []engine.Segment, langTok, taskTok int, offset float64, segSize int) ([]engine.Word, error) {
	c := e.cfg
	var text []int
	for _, t := range res.tokens {
		if t < c.eot {
			text = append(text, t)
		}
	}
	if len(text) == 0 || len(segs) == 0 {
		return nil, nil
	}
	_, sotSeq := e.initialTokens(decodeOptions{language: langTok, task: taskTok})
	seq := append(sotSeq, int64(c.noTimestamps))
	first := len(seq) - 1 // the position that predicts text[0]
	for _, t := range text {
		seq = append(seq, int64(t))
	}
	seq = append(seq, int64(c.eot))
	cross := make([][]float32, len(e.names.cross))
	if _, err := s.start(ctx, seq, cross); err != nil {
		return nil, err
	}
	layerIdx := map[int]int{}
	for i, l := range c.alignmentLayers() {
		layerIdx[l] = i
	}
	nf := max(1, min(c.encPos, segSize/framesPerTimestamp))
	rows := len(text) + 1
	matrix := make([]float64, rows*nf)
	w := make([]float64, len(seq)*nf)
	med := make([]float64, nf)
	for _, h := range c.alignmentHeads {
		buf := cross[layerIdx[h[0]]]
		for p := range seq {
			off := (p*c.heads + h[1]) * c.encPos
			for f := range nf {
				w[p*nf+f] = float64(buf[off+f])
			}
		}
		// Normalise over tokens, per frame.
		for f := range nf {
			var mean, sq float64
			for p := range seq {
				mean += w[p*nf+f]
			}
			mean /= float64(len(seq))
			for p := range seq {
				d := w[p*nf+f] - mean
				sq += d * d
			}
			std := math.Sqrt(sq / float64(len(seq)))
			if std == 0 {
				std = 1
			}
			for p := range seq {
				w[p*nf+f] = (w[p*nf+f] - mean) / std
			}
		}
		for r := range rows {
			row := w[(first+r)*nf : (first+r+1)*nf]
			medianFilter(row, med)
			for f, v := range med {
				matrix[r*nf+f] += v / float64(len(c.alignmentHeads))
			}
		}
	}
	tokIdx, timeIdx := dtw(matrix, rows, nf)
	jumps := make([]float64, 0, rows)
	for i := range tokIdx {
		if i == 0 || tokIdx[i] != tokIdx[i-1] {
			jumps = append(jumps, float64(timeIdx[i])*secondsPerTimestamp)
		}
	}
	if len(jumps) != rows {
		return nil, nil
	}
	groups := e.wordGroups(text)
	end := offset + float64(segSize*hopLength)/sampleRate
	var words []engine.Word
	b := 0
	for _, g := range groups {
		start, stop := offset+jumps[b], offset+jumps[b+len(g)]
		b += len(g)
		ids := make([]int64, len(g))
		for i, t := range g {
			ids[i] = int64(t)
		}
		wt := e.tok.Decode(ids, true)
		if strings.TrimSpace(wt) == "" {
			continue
		}
		start, stop = math.Min(start, end), math.Min(stop, end)
		if n := len(words); n > 0 && start < words[n-1].End {
			start = words[n-1].End
		}
		words = append(words, engine.Word{Word: wt, Start: start, End: math.Max(start, stop)})
	}
	return words, nil
}

// wordGroups splits text tokens into words: a token whose text starts with
// a space starts a word, and a token of punctuation only joins the word
// before it.
func (e *Engine) wordGroups(text []int) [][]int {
	var groups [][]int
	for _, t := range text {
		piece := string(e.tok.TokenBytes(int64(t)))
		punct := strings.TrimFunc(piece, func(r rune) bool { return unicode.IsPunct(r) || unicode.IsSpace(r) }) == "" && !strings.HasPrefix(piece, " ")
		if len(groups) == 0 || (strings.HasPrefix(piece, " ") && !punct) {
			groups = append(groups, []int{t})
			continue
		}
		groups[len(groups)-1] = append(groups[len(groups)-1], t)
	}
	return groups
}

// medianFilter writes the width-7 running median of x (reflect padding) to
// dst.
func medianFilter(x, dst []float64) {
	n := len(x)
	half := medianWidth / 2
	if n <= half {
		copy(dst, x)
		return
	}
	var win [medianWidth]float64
	for i := range n {
		for k := -half; k <= half; k++ {
			j := i + k
			if j < 0 {
				j = -j
			} else if j >= n {
				j = 2*(n-1) - j
			}
			win[k+half] = x[j]
		}
		s := win
		sort.Float64s(s[:])
		dst[i] = s[half]
	}
}

// dtw aligns rows (tokens) with columns (frames) maximising the summed
// matrix values along a monotone path, and returns the path as parallel
// row and column indices.
func dtw(m []float64, rows, cols int) ([]int, []int) {
	inf := math.Inf(1)
	cost := make([]float64, (rows+1)*(cols+1))
	trace := make([]int8, (rows+1)*(cols+1))
	for i := range cost {
		cost[i] = inf
	}
	at := func(i, j int) int { return i*(cols+1) + j }
	cost[0] = 0
	for j := 1; j <= cols; j++ {
		for i := 1; i <= rows; i++ {
			c0, c1, c2 := cost[at(i-1, j-1)], cost[at(i-1, j)], cost[at(i, j-1)]
			var c float64
			var t int8
			switch {
			case c0 < c1 && c0 < c2:
				c, t = c0, 0
			case c1 < c0 && c1 < c2:
				c, t = c1, 1
			default:
				c, t = c2, 2
			}
			cost[at(i, j)] = -m[(i-1)*cols+j-1] + c
			trace[at(i, j)] = t
		}
	}
	var ti, tj []int
	i, j := rows, cols
	for i > 0 || j > 0 {
		ti = append(ti, i-1)
		tj = append(tj, j-1)
		var t int8
		switch {
		case i == 0:
			t = 2
		case j == 0:
			t = 1
		default:
			t = trace[at(i, j)]
		}
		switch t {
		case 0:
			i, j = i-1, j-1
		case 1:
			i--
		default:
			j--
		}
	}
	// Drop the (0,0)-origin steps (i or j == -1 never appear after the
	// first step back from the corner) and reverse.
	var ri, rj []int
	for k := len(ti) - 1; k >= 0; k-- {
		if ti[k] >= 0 && tj[k] >= 0 {
			ri = append(ri, ti[k])
			rj = append(rj, tj[k])
		}
	}
	return ri, rj
}
