package chaos

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
	"sort"
	"time"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// TimelinePoint is one second of a scenario.
type TimelinePoint struct {
	// Sec is the second, counted from the scenario start, the requests started
	// in.
	Sec int `json:"sec"`
	// OK counts requests classed ok.
	OK         int     `json:"ok"`
	Allowed    int     `json:"allowed"`    // shed, limited, entry down or paused, backend cut mid-response
	Unexpected int     `json:"unexpected"` // must be zero
	P99ms      float64 `json:"p99_ms"`     // ok inference requests
}

// Series buckets a scenario's records by the second they started in (the
// final reads after convergence are not load and are left out).
func Series(res *Result) []TimelinePoint {
	end := res.LoadEnd
	for _, r := range res.Records {
		if !r.Final {
			end = max(end, r.Start)
		}
	}
	n := int(end/time.Second) + 1
	pts := make([]TimelinePoint, n)
	lat := make([][]float64, n)
	for i := range pts {
		pts[i].Sec = i
	}
	for _, r := range res.Records {
		i := int(r.Start / time.Second)
		if i < 0 || i >= n || r.Final {
			continue
		}
		switch r.Class {
		case ClassOK:
			pts[i].OK++
			if r.Kind.dataPlane() {
				lat[i] = append(lat[i], float64(r.End-r.Start)/float64(time.Millisecond))
			}
		case ClassUnexpected:
			pts[i].Unexpected++
		default:
			pts[i].Allowed++
		}
	}
	for i := range pts {
		sort.Float64s(lat[i])
		pts[i].P99ms = percentile(lat[i], 0.99)
	}
	return pts
}

// palette holds the timeline's colours.
type palette struct {
	bg, axis, grid, ok, allowed, unexpected, p99, down, partition, pause, mark, recover, pass color.RGBA
}

func timelinePalette() palette {
	return palette{
		bg: color.RGBA{255, 255, 255, 255}, axis: color.RGBA{60, 60, 60, 255}, grid: color.RGBA{225, 225, 225, 255},
		ok: color.RGBA{76, 160, 90, 255}, allowed: color.RGBA{240, 170, 40, 255}, unexpected: color.RGBA{215, 40, 40, 255},
		p99: color.RGBA{40, 90, 200, 255}, down: color.RGBA{250, 215, 215, 255}, partition: color.RGBA{220, 210, 245, 255},
		pause: color.RGBA{250, 240, 190, 255}, mark: color.RGBA{120, 30, 30, 255}, recover: color.RGBA{30, 110, 60, 255},
		pass: color.RGBA{30, 130, 60, 255},
	}
}

const (
	tlWidth   = 1400
	tlPanelH  = 250
	tlLeft    = 60
	tlRight   = 70
	tlTop     = 72
	tlBottom  = 30
	tlLegendH = 40
)

type canvas struct {
	img *image.RGBA
	pal palette
}

func (c canvas) rect(x0, y0, x1, y1 int, col color.Color) {
	draw.Draw(c.img, image.Rect(min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1)), image.NewUniform(col), image.Point{}, draw.Src)
}

func (c canvas) line(x0, y0, x1, y1 int, col color.Color) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := sign(x1-x0), sign(y1-y0)
	err := dx + dy
	for i := 0; i < 10000; i++ {
		c.img.Set(x0, y0, col)
		if x0 == x1 && y0 == y1 {
			return
		}
		e2 := 2 * err
		if e2 >= dy {
			err += dy
			x0 += sx
		}
		if e2 <= dx {
			err += dx
			y0 += sy
		}
	}
}

func (c canvas) text(x, y int, s string, col color.Color) {
	d := font.Drawer{Dst: c.img, Src: image.NewUniform(col), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

func textWidth(s string) int { return 7 * len(s) }

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

func sign(x int) int {
	switch {
	case x < 0:
		return -1
	case x > 0:
		return 1
	}
	return 0
}

// niceMax returns a round axis maximum at or above v: four ticks of 1,
// 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a power of ten.
func niceMax(v float64) float64 {
	if v <= 0 {
		return 4
	}
	q := v / 4
	p := math.Pow(10, math.Floor(math.Log10(q)))
	for _, m := range []float64{1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10} {
		if m*p >= q {
			return 4 * m * p
		}
	}
	return 40 * p
}

// WriteTimeline draws one PNG with a panel per scenario that ran: stacked
// bars of requests per second (ok, allowed errors, unexpected errors), the
// p99 latency line of ok inference requests, fault spans shaded and every
// fault and recovery marked.
func WriteTimeline(path string, reps []ScenarioReport) error {
	var panels []ScenarioReport
	for _, r := range reps {
		if len(r.Series) > 0 {
			panels = append(panels, r)
		}
	}
	h := max(len(panels), 1)*tlPanelH + tlLegendH
	c := canvas{img: image.NewRGBA(image.Rect(0, 0, tlWidth, h)), pal: timelinePalette()}
	c.rect(0, 0, tlWidth, h, c.pal.bg)
	if len(panels) == 0 {
		c.text(20, 40, "no scenario ran", c.pal.axis)
	}
	for i, sr := range panels {
		drawPanel(c, i*tlPanelH, sr)
	}
	drawLegend(c, h-tlLegendH+8)
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, c.img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func drawPanel(c canvas, top int, sr ScenarioReport) {
	x0, x1 := tlLeft, tlWidth-tlRight
	y0, y1 := top+tlTop, top+tlPanelH-tlBottom // plot area: y1 is the x axis
	verdict, vcol := "PASS", c.pal.pass
	if !sr.Pass {
		verdict, vcol = "FAIL", c.pal.unexpected
	}
	c.text(10, top+16, fmt.Sprintf("%s: %s", sr.Name, sr.Title), c.pal.axis)
	c.text(tlWidth-tlRight-textWidth(verdict), top+16, verdict, vcol)
	n := len(sr.Series)
	span := float64(max(n, 1))
	xs := func(sec float64) int { return x0 + int(sec/span*float64(x1-x0)) }
	maxReq, maxLat := 1.0, 1.0
	for _, p := range sr.Series {
		maxReq = max(maxReq, float64(p.OK+p.Allowed+p.Unexpected))
		maxLat = max(maxLat, p.P99ms)
	}
	// Headroom above the bars leaves the fault shading visible.
	maxReq, maxLat = niceMax(maxReq*1.3), niceMax(maxLat*1.1)
	ys := func(v float64) int { return y1 - int(v/maxReq*float64(y1-y0)) }
	yl := func(v float64) int { return y1 - int(v/maxLat*float64(y1-y0)) }

	// Fault spans first, then grid, bars, the latency line and markers.
	for _, f := range sr.Faults {
		end := span
		if f.EndAt != nil {
			end = f.EndAt.Seconds()
		}
		col := c.pal.down
		switch {
		case f.Event.Kind.isPartition():
			col = c.pal.partition
		case f.Event.Kind == EvPause:
			col = c.pal.pause
		}
		c.rect(xs(f.Event.At.Seconds()), y0, max(xs(end), xs(f.Event.At.Seconds())+2), y1, col)
	}
	for i := 1; i <= 4; i++ {
		y := y1 - i*(y1-y0)/4
		c.rect(x0, y, x1, y+1, c.pal.grid)
		c.text(x0-8-textWidth(fmtNum(maxReq*float64(i)/4)), y+4, fmtNum(maxReq*float64(i)/4), c.pal.axis)
		c.text(x1+6, y+4, fmtNum(maxLat*float64(i)/4), c.pal.p99)
	}
	bw := max(1, (x1-x0)/max(n, 1)-1)
	for _, p := range sr.Series {
		x := xs(float64(p.Sec))
		b0, total := y1, 0
		for _, seg := range []struct {
			v   int
			col color.Color
		}{{p.OK, c.pal.ok}, {p.Allowed, c.pal.allowed}, {p.Unexpected, c.pal.unexpected}} {
			if seg.v == 0 {
				continue
			}
			total += seg.v
			b1 := ys(float64(total))
			c.rect(x, b1, x+bw, b0, seg.col)
			b0 = b1
		}
	}
	prevX, prevY := -1, 0
	for _, p := range sr.Series {
		if p.OK == 0 {
			continue
		}
		x, y := xs(float64(p.Sec)+0.5), yl(p.P99ms)
		if prevX >= 0 {
			c.line(prevX, prevY, x, y, c.pal.p99)
			c.line(prevX, prevY+1, x, y+1, c.pal.p99)
		}
		prevX, prevY = x, y
	}
	c.rect(x0, y1, x1, y1+1, c.pal.axis)
	c.rect(x0, y0, x0+1, y1, c.pal.axis)
	for s := 0; s <= n; s += 10 {
		c.rect(xs(float64(s)), y1, xs(float64(s))+1, y1+4, c.pal.axis)
		c.text(xs(float64(s))-textWidth(fmt.Sprint(s))/2, y1+16, fmt.Sprint(s), c.pal.axis)
	}
	c.text(x1-textWidth("seconds"), y1+28, "seconds", c.pal.axis)
	c.text(4, y0-12, "req/s", c.pal.axis)
	c.text(x1+6, y0-12, "p99 ms", c.pal.p99)
	// Markers: label rows alternate so neighbouring labels stay readable.
	lastX := []int{-1000, -1000, -1000, -1000}
	for _, e := range sr.Events {
		x := xs(e.At.Seconds())
		col := c.pal.mark
		if !e.Kind.isFault() {
			col = c.pal.recover
		}
		for y := y0; y < y1; y += 5 {
			c.rect(x, y, x+2, y+3, col)
		}
		label := shortKind(e.Kind)
		if len(e.Nodes) > 0 && len(e.Nodes) <= 2 {
			label += " " + join(e.Nodes)
		}
		row := 0
		for row < len(lastX)-1 && x < lastX[row]+8 {
			row++
		}
		lastX[row] = x + textWidth(label)
		c.text(x+2, top+30+row*11, label, col)
	}
}

// shortKind is an event's label on the timeline.
func shortKind(k EventKind) string {
	switch k {
	case EvTerminate:
		return "term"
	case EvRestart:
		return "start"
	case EvKillLeader:
		return "kill-leader"
	case EvNewLeader:
		return "leader"
	case EvPause:
		return "stop"
	case EvResume:
		return "cont"
	}
	return string(k)
}

func join(ids []string) string {
	s := ""
	for i, id := range ids {
		if i > 0 {
			s += ","
		}
		s += id
	}
	return s
}

func fmtNum(v float64) string {
	if v >= 10 || v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

func drawLegend(c canvas, y int) {
	x := 10
	for _, it := range []struct {
		col   color.Color
		label string
	}{
		{c.pal.ok, "ok"}, {c.pal.allowed, "allowed errors (shed 503, 429, entry down/paused, backend cut)"}, {c.pal.unexpected, "unexpected errors"},
		{c.pal.p99, "p99 latency (right axis)"}, {c.pal.down, "node down"}, {c.pal.partition, "partition"}, {c.pal.pause, "paused"},
		{c.pal.mark, "fault"}, {c.pal.recover, "recovery"},
	} {
		c.rect(x, y, x+14, y+10, it.col)
		c.text(x+18, y+10, it.label, c.pal.axis)
		x += 18 + textWidth(it.label) + 16
	}
}
