package vision

import (
	"math"
	"sort"
)

// DB (differentiable binarisation) post-processing of a text-probability
// map, as PaddleOCR's DBPostProcess does it with OpenCV, in plain Go:
// binarise at dbThresh, take each 8-connected region of the bitmap (the
// outer contour cv2.findContours would give), fit its minimum-area
// rectangle, score it by the mean probability inside, grow it by the DB
// "unclip" distance and keep it when it is big enough.

// quad is a rotated rectangle's four corners: top-left, top-right,
// bottom-right, bottom-left (reading orientation: p0->p1 runs along the
// text).
type quad [4][2]float64

// textBox is one detected text region in probability-map pixels.
type textBox struct {
	q     quad
	score float64
}

// dbParams are the DB post-processing settings.
type dbParams struct {
	thresh, boxThresh, unclip float64
	maxCandidates             int
	minSize                   float64
}

// dbBoxes finds the text regions of the w x h probability map prob.
func dbBoxes(prob []float32, w, h int, p dbParams) []textBox {
	bin := make([]bool, len(prob))
	for i, v := range prob {
		bin[i] = float64(v) > p.thresh
	}
	label := make([]int32, len(prob))
	var out []textBox
	var stack []int32
	var ext []pt // row extremes of the current region
	rowMin, rowMax := make([]int, h), make([]int, h)
	for y := range rowMin {
		rowMin[y] = -1
	}
	var rows []int
	regions := 0
	for start := range bin {
		if !bin[start] || label[start] != 0 {
			continue
		}
		regions++
		if regions > p.maxCandidates {
			break
		}
		// Flood fill (8-connected), recording each row's leftmost and
		// rightmost pixel: their convex hull is the region's.
		id := int32(regions)
		label[start] = id
		stack = append(stack[:0], int32(start))
		rows = rows[:0]
		for len(stack) > 0 {
			i := int(stack[len(stack)-1])
			stack = stack[:len(stack)-1]
			x, y := i%w, i/w
			switch {
			case rowMin[y] < 0:
				rowMin[y], rowMax[y] = x, x
				rows = append(rows, y)
			case x < rowMin[y]:
				rowMin[y] = x
			case x > rowMax[y]:
				rowMax[y] = x
			}
			for dy := -1; dy <= 1; dy++ {
				for dx := -1; dx <= 1; dx++ {
					xx, yy := x+dx, y+dy
					if xx < 0 || yy < 0 || xx >= w || yy >= h {
						continue
					}
					j := yy*w + xx
					if bin[j] && label[j] == 0 {
						label[j] = id
						stack = append(stack, int32(j))
					}
				}
			}
		}
		ext = ext[:0]
		for _, y := range rows {
			ext = append(ext, pt{float64(rowMin[y]), float64(y)}, pt{float64(rowMax[y]), float64(y)})
			rowMin[y] = -1
		}
		q, short := minAreaRect(convexHull(ext))
		if short < p.minSize {
			continue
		}
		score := quadScore(prob, w, h, q)
		if score < p.boxThresh {
			continue
		}
		q, short = unclip(q, p.unclip)
		if short < p.minSize+2 {
			continue
		}
		out = append(out, textBox{q: q, score: score})
	}
	return out
}

// pt is a 2-D point.
type pt struct{ x, y float64 }

// convexHull returns the hull of ps counter-clockwise (Andrew's monotone
// chain); ps is reordered.
func convexHull(ps []pt) []pt {
	sort.Slice(ps, func(i, j int) bool {
		if ps[i].x != ps[j].x {
			return ps[i].x < ps[j].x
		}
		return ps[i].y < ps[j].y
	})
	// Drop duplicates.
	u := ps[:0]
	for i, p := range ps {
		if i == 0 || p != ps[i-1] {
			u = append(u, p)
		}
	}
	ps = u
	if len(ps) < 3 {
		return append([]pt(nil), ps...)
	}
	cross := func(o, a, b pt) float64 { return (a.x-o.x)*(b.y-o.y) - (a.y-o.y)*(b.x-o.x) }
	hull := make([]pt, 0, 2*len(ps))
	for _, p := range ps {
		for len(hull) >= 2 && cross(hull[len(hull)-2], hull[len(hull)-1], p) <= 0 {
			hull = hull[:len(hull)-1]
		}
		hull = append(hull, p)
	}
	lower := len(hull) + 1
	for i := len(ps) - 2; i >= 0; i-- {
		p := ps[i]
		for len(hull) >= lower && cross(hull[len(hull)-2], hull[len(hull)-1], p) <= 0 {
			hull = hull[:len(hull)-1]
		}
		hull = append(hull, p)
	}
	return hull[:len(hull)-1]
}

// minAreaRect fits the smallest rectangle around the convex polygon hull
// (one of its sides lies on a hull edge) and returns it with its shorter
// side's length. A hull of one or two points gives a degenerate rectangle.
func minAreaRect(hull []pt) (quad, float64) {
	switch len(hull) {
	case 0:
		return quad{}, 0
	case 1:
		p := hull[0]
		return quad{{p.x, p.y}, {p.x, p.y}, {p.x, p.y}, {p.x, p.y}}, 0
	}
	best := math.Inf(1)
	var bq quad
	var bshort float64
	n := len(hull)
	for i := range n {
		a, b := hull[i], hull[(i+1)%n]
		ex, ey := b.x-a.x, b.y-a.y
		l := math.Hypot(ex, ey)
		if l == 0 {
			continue
		}
		ux, uy := ex/l, ey/l // edge direction
		vx, vy := -uy, ux    // normal
		minU, maxU, minV, maxV := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
		for _, p := range hull {
			du := (p.x-a.x)*ux + (p.y-a.y)*uy
			dv := (p.x-a.x)*vx + (p.y-a.y)*vy
			minU, maxU = math.Min(minU, du), math.Max(maxU, du)
			minV, maxV = math.Min(minV, dv), math.Max(maxV, dv)
		}
		area := (maxU - minU) * (maxV - minV)
		if area < best-1e-9 {
			best = area
			corner := func(u, v float64) [2]float64 {
				return [2]float64{a.x + u*ux + v*vx, a.y + u*uy + v*vy}
			}
			bq = orderQuad([4][2]float64{corner(minU, minV), corner(maxU, minV), corner(maxU, maxV), corner(minU, maxV)})
			bshort = math.Min(maxU-minU, maxV-minV)
		}
	}
	return bq, bshort
}

// orderQuad orders a rectangle's corners as PaddleOCR's get_mini_boxes
// does: of the two leftmost corners the upper is top-left and the lower
// bottom-left; of the two rightmost the upper is top-right.
func orderQuad(c [4][2]float64) quad {
	s := c
	sort.Slice(s[:], func(i, j int) bool { return s[i][0] < s[j][0] })
	tl, bl := s[0], s[1]
	if s[1][1] < s[0][1] {
		tl, bl = s[1], s[0]
	}
	tr, br := s[2], s[3]
	if s[3][1] < s[2][1] {
		tr, br = s[3], s[2]
	}
	return quad{tl, tr, br, bl}
}

// sides returns a rectangle's width (along p0->p1) and height (p0->p3).
func (q quad) sides() (float64, float64) {
	return math.Hypot(q[1][0]-q[0][0], q[1][1]-q[0][1]), math.Hypot(q[3][0]-q[0][0], q[3][1]-q[0][1])
}

// bounds is the axis-aligned bounding box x1, y1, x2, y2 of q.
func (q quad) bounds() (float64, float64, float64, float64) {
	x1, y1, x2, y2 := q[0][0], q[0][1], q[0][0], q[0][1]
	for _, p := range q[1:] {
		x1, x2 = math.Min(x1, p[0]), math.Max(x2, p[0])
		y1, y2 = math.Min(y1, p[1]), math.Max(y2, p[1])
	}
	return x1, y1, x2, y2
}

// contains reports whether (x, y) is inside the convex quad q (edges
// included), whatever its winding.
func (q quad) contains(x, y float64) bool {
	var pos, neg bool
	for i := range 4 {
		a, b := q[i], q[(i+1)%4]
		c := (b[0]-a[0])*(y-a[1]) - (b[1]-a[1])*(x-a[0])
		pos = pos || c > 1e-9
		neg = neg || c < -1e-9
	}
	return !(pos && neg)
}

// quadScore is the mean probability of the map pixels inside q (PaddleOCR's
// box_score_fast: the polygon's pixel mask over its bounding box).
func quadScore(prob []float32, w, h int, q quad) float64 {
	x1, y1, x2, y2 := q.bounds()
	xa, xb := max(0, int(math.Floor(x1))), min(w-1, int(math.Ceil(x2)))
	ya, yb := max(0, int(math.Floor(y1))), min(h-1, int(math.Ceil(y2)))
	var sum float64
	var n int
	for y := ya; y <= yb; y++ {
		for x := xa; x <= xb; x++ {
			if q.contains(float64(x), float64(y)) {
				sum += float64(prob[y*w+x])
				n++
			}
		}
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}

// unclip grows the rectangle q by DB's distance area*ratio/perimeter on
// every side. For a rectangle, offsetting the polygon with round joins (as
// pyclipper does) and fitting a minimum-area rectangle around the result
// gives exactly the rectangle grown by that distance, so no polygon
// clipping is needed. It returns the grown quad and its shorter side.
func unclip(q quad, ratio float64) (quad, float64) {
	w, h := q.sides()
	if w+h == 0 {
		return q, 0
	}
	d := w * h * ratio / (2 * (w + h))
	ux, uy := unit(q[1][0]-q[0][0], q[1][1]-q[0][1], 1, 0)
	vx, vy := unit(q[3][0]-q[0][0], q[3][1]-q[0][1], -uy, ux)
	grow := func(p [2]float64, su, sv float64) [2]float64 {
		return [2]float64{p[0] + d*(su*ux+sv*vx), p[1] + d*(su*uy+sv*vy)}
	}
	g := quad{grow(q[0], -1, -1), grow(q[1], 1, -1), grow(q[2], 1, 1), grow(q[3], -1, 1)}
	return g, math.Min(w, h) + 2*d
}

// unit normalises (x, y), or returns (dx, dy) for a zero vector.
func unit(x, y, dx, dy float64) (float64, float64) {
	l := math.Hypot(x, y)
	if l == 0 {
		return dx, dy
	}
	return x / l, y / l
}

// sortReading orders boxes as PaddleOCR's sorted_boxes does: by top-left
// y then x, then boxes whose tops are within 10 pixels are put left to
// right.
func sortReading(boxes []textBox) {
	sort.SliceStable(boxes, func(i, j int) bool {
		a, b := boxes[i].q[0], boxes[j].q[0]
		if a[1] != b[1] {
			return a[1] < b[1]
		}
		return a[0] < b[0]
	})
	for i := 0; i < len(boxes)-1; i++ {
		for j := i; j >= 0; j-- {
			a, b := boxes[j].q[0], boxes[j+1].q[0]
			if math.Abs(b[1]-a[1]) < 10 && b[0] < a[0] {
				boxes[j], boxes[j+1] = boxes[j+1], boxes[j]
			} else {
				break
			}
		}
	}
}
