package models

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/infermesh/infermesh/node/apierr"
)

// download fetches a plan's files into the staging folder: from each peer
// that has the model in turn, then from the outside source, resuming every
// attempt where the last one stopped, and verifies each file's sha256.
type download struct {
	p     *Puller
	j     *Job
	plan  *pullPlan
	dir   string
	peers []PeerSource

	done   atomic.Int64 // bytes of finished files
	cur    atomic.Int64 // bytes of the file being fetched
	totalB atomic.Int64
	sizes  map[string]int64
	sums   map[string]string
}

func (d *download) completed() int64 { return d.done.Load() + d.cur.Load() }
func (d *download) total() int64     { return d.totalB.Load() }

// run returns an error code and error when the pull cannot complete.
func (d *download) run() (string, error) {
	if err := os.MkdirAll(d.dir, 0o755); err != nil {
		return apierr.CodeInstallFailed, err
	}
	var total int64
	for _, f := range d.plan.files {
		total += f.size
	}
	d.totalB.Store(total)
	d.sizes, d.sums = map[string]int64{}, map[string]string{}
	for _, f := range d.plan.files {
		if code, err := d.file(f); err != nil {
			return code, err
		}
	}
	return "", nil
}

// file fetches and verifies one file.
func (d *download) file(f planFile) (string, error) {
	path := filepath.Join(d.dir, f.name+".part")
	var errs []error
	complete := false
	try := func(what string, fetch func(ctx context.Context, offset int64, w io.Writer) error) bool {
		err := d.attempt(path, f, what, fetch)
		if err == nil {
			return true
		}
		errs = append(errs, fmt.Errorf("%s: %w", what, err))
		d.p.log.Info("pull attempt failed", "model", d.j.key, "file", f.name, "source", what, "err", err)
		return false
	}
	for _, src := range d.peers {
		src := src
		if try("peer "+src.ID(), func(ctx context.Context, off int64, w io.Writer) error {
			return src.Fetch(ctx, d.j.key, f.name, off, w)
		}) {
			complete = true
			break
		}
		if d.p.ctx.Err() != nil {
			break
		}
	}
	for i := 0; !complete && f.url != "" && i < d.p.cfg.Retries && d.p.ctx.Err() == nil; i++ {
		if i > 0 {
			wait := min(time.Duration(200<<(i-1))*time.Millisecond, 5*time.Second)
			select {
			case <-time.After(wait):
			case <-d.p.ctx.Done():
			}
		}
		complete = try(hostOf(f.url), func(ctx context.Context, off int64, w io.Writer) error {
			return d.httpFetch(ctx, f, off, w)
		})
	}
	if !complete {
		if len(errs) == 0 {
			errs = append(errs, errors.New("no source has it"))
		}
		return apierr.CodeDownloadFailed, fmt.Errorf("%s: %s", f.name, joinDistinct(errs))
	}

	d.j.progress(Progress{Phase: "verifying " + f.name, Completed: d.completed(), Total: d.total()}, true)
	n, sum, err := copyHashed(path, "")
	if err != nil {
		return apierr.CodeDownloadFailed, err
	}
	if (f.sha != "" && sum != f.sha) || (f.size > 0 && n != f.size) {
		// A wrong file is never kept: the next pull starts clean.
		os.RemoveAll(d.dir)
		return apierr.CodeChecksumMismatch, fmt.Errorf("%s: got %d bytes with sha256 %s, want %d bytes with sha256 %s", f.name, n, sum, f.size, f.sha)
	}
	if err := os.Rename(path, filepath.Join(d.dir, f.name)); err != nil {
		return apierr.CodeInstallFailed, err
	}
	d.sizes[f.name], d.sums[f.name] = n, sum
	d.cur.Store(0)
	d.done.Add(n)
	return "", nil
}

// attempt appends to the partial file from its current length using fetch,
// reporting progress as bytes arrive; a stall cancels it.
func (d *download) attempt(path string, f planFile, what string, fetch func(ctx context.Context, offset int64, w io.Writer) error) error {
	out, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	offset, err := out.Seek(0, io.SeekEnd)
	if err != nil {
		return err
	}
	if f.size > 0 && offset > f.size {
		// Longer than the file can be: start over.
		if err := out.Truncate(0); err != nil {
			return err
		}
		offset, _ = out.Seek(0, io.SeekStart)
	}
	if f.size > 0 && offset == f.size {
		d.cur.Store(offset)
		return nil
	}
	d.cur.Store(offset)
	phase := "downloading " + f.name + " from " + what
	d.j.progress(Progress{Phase: phase, Completed: d.completed(), Total: d.total()}, true)

	ctx, cancel := context.WithCancelCause(d.p.ctx)
	defer cancel(nil)
	stall := time.AfterFunc(d.p.cfg.StallTimeout, func() {
		cancel(fmt.Errorf("nothing received for %s", d.p.cfg.StallTimeout))
	})
	defer stall.Stop()
	w := &progressWriter{out: out, onWrite: func(n int) {
		stall.Reset(d.p.cfg.StallTimeout)
		d.cur.Add(int64(n))
		d.j.progress(Progress{Phase: phase, Completed: d.completed(), Total: d.total()}, false)
	}}
	err = fetch(ctx, offset, w)
	if cause := context.Cause(ctx); err != nil && cause != nil && !errors.Is(cause, context.Canceled) {
		err = fmt.Errorf("%w (%v)", err, cause)
	}
	if serr := out.Sync(); err == nil {
		err = serr
	}
	d.j.progress(Progress{Phase: phase, Completed: d.completed(), Total: d.total()}, true)
	return err
}

// progressWriter writes to the partial file and reports each write.
type progressWriter struct {
	out     *os.File
	onWrite func(n int)
}

func (w *progressWriter) Write(p []byte) (int, error) {
	n, err := w.out.Write(p)
	if n > 0 {
		w.onWrite(n)
	}
	return n, err
}

// httpFetch gets f.url from offset. A server that ignores the Range header
// sends the whole file; the bytes already held are skipped, so progress
// never goes back.
func (d *download) httpFetch(ctx context.Context, f planFile, offset int64, w io.Writer) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.url, nil)
	if err != nil {
		return err
	}
	if offset > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", offset))
	}
	resp, err := d.p.cfg.HTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body io.Reader = resp.Body
	switch {
	case resp.StatusCode == http.StatusPartialContent && offset > 0:
		start, size, ok := parseContentRange(resp.Header.Get("Content-Range"))
		if !ok || start != offset {
			return fmt.Errorf("bad Content-Range %q for offset %d", resp.Header.Get("Content-Range"), offset)
		}
		d.learnSize(f, size)
	case resp.StatusCode == http.StatusOK:
		d.learnSize(f, resp.ContentLength)
		if offset > 0 {
			if _, err := io.CopyN(io.Discard, resp.Body, offset); err != nil {
				return fmt.Errorf("skipping %d bytes already held: %w", offset, err)
			}
		}
	case resp.StatusCode == http.StatusRequestedRangeNotSatisfiable && offset > 0:
		// The partial file already holds everything; the digest decides.
		return nil
	default:
		return fmt.Errorf("GET %s: %s", f.url, resp.Status)
	}
	n, err := io.Copy(w, body)
	if err == nil && resp.ContentLength >= 0 && resp.StatusCode == http.StatusPartialContent && n != resp.ContentLength {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// learnSize adds a file's size to the total when the plan did not know it.
func (d *download) learnSize(f planFile, size int64) {
	if size <= 0 {
		return
	}
	for i := range d.plan.files {
		if d.plan.files[i].name == f.name && d.plan.files[i].size == 0 {
			d.plan.files[i].size = size
			d.totalB.Add(size)
		}
	}
}

// parseContentRange reads "bytes START-END/SIZE".
func parseContentRange(s string) (start, size int64, ok bool) {
	s, found := strings.CutPrefix(s, "bytes ")
	if !found {
		return 0, 0, false
	}
	rng, total, found := strings.Cut(s, "/")
	if !found {
		return 0, 0, false
	}
	a, _, found := strings.Cut(rng, "-")
	if !found {
		return 0, 0, false
	}
	start, err := strconv.ParseInt(a, 10, 64)
	if err != nil {
		return 0, 0, false
	}
	size, err = strconv.ParseInt(total, 10, 64)
	if err != nil {
		size = -1
	}
	return start, size, true
}

// joinDistinct joins error messages, each distinct one once, with the
// number of attempts that failed with it.
func joinDistinct(errs []error) string {
	var order []string
	count := map[string]int{}
	for _, err := range errs {
		m := err.Error()
		if count[m] == 0 {
			order = append(order, m)
		}
		count[m]++
	}
	parts := make([]string, 0, len(order))
	for _, m := range order {
		if count[m] > 1 {
			m = fmt.Sprintf("%s (%d attempts)", m, count[m])
		}
		parts = append(parts, m)
	}
	return strings.Join(parts, "; ")
}
