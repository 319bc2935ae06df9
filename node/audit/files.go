package audit

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// fileName is the name of log file i: audit-000001.jsonl, ...
func fileName(i int) string { return fmt.Sprintf("audit-%06d.jsonl", i) }

// parseFileName returns the index of a log file name.
func parseFileName(name string) (int, bool) {
	s, ok := strings.CutPrefix(name, "audit-")
	if !ok {
		return 0, false
	}
	s, ok = strings.CutSuffix(s, ".jsonl")
	if !ok || len(s) < 6 {
		return 0, false
	}
	i, err := strconv.Atoi(s)
	return i, err == nil && i > 0
}

// listFiles returns the indexes of the log files in dir, ascending.
func listFiles(dir string) ([]int, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range ents {
		if i, ok := parseFileName(e.Name()); ok && e.Type().IsRegular() {
			out = append(out, i)
		}
	}
	sort.Ints(out)
	return out, nil
}

func (l *Log) path(i int) string { return filepath.Join(l.dir, fileName(i)) }

// recover finds the files, truncates a torn last line, sets the chain
// head from this node's last record and opens the newest file.
func (l *Log) recover() error {
	files, err := listFiles(l.dir)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	l.files = files
	l.seq, l.prev = 0, Genesis(l.opts.NodeID)
	if len(files) == 0 {
		return l.create(1)
	}
	newest := files[len(files)-1]
	f, err := os.OpenFile(l.path(newest), os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	size, err := cutTorn(f, st.Size())
	if err != nil {
		return fmt.Errorf("audit: %s: %w", f.Name(), err)
	}
	if torn := st.Size() - size; torn > 0 {
		l.torn = torn
		l.log.Warn("audit: truncated a torn last record (the node stopped mid-write)",
			"file", f.Name(), "bytes", torn)
	}
	if err := l.findHead(); err != nil {
		return err
	}
	return l.openAppend(newest)
}

// cutTorn truncates bytes after the last newline of f and returns the
// new size.
func cutTorn(f *os.File, size int64) (int64, error) {
	if size == 0 {
		return 0, nil
	}
	var last [1]byte
	if _, err := f.ReadAt(last[:], size-1); err != nil {
		return 0, err
	}
	if last[0] == '\n' {
		return size, nil
	}
	keep := int64(0)
	for off := size; off > 0; {
		n := min(int64(64<<10), off)
		off -= n
		b := make([]byte, n)
		if _, err := f.ReadAt(b, off); err != nil {
			return 0, err
		}
		if j := bytes.LastIndexByte(b, '\n'); j >= 0 {
			keep = off + int64(j) + 1
			break
		}
	}
	if err := f.Truncate(keep); err != nil {
		return 0, err
	}
	return keep, f.Sync()
}

// findHead sets the chain head from this node's last record, searching
// the files newest first. Every line it passes on the way must parse; the
// record found must verify with the log's key.
func (l *Log) findHead() error {
	for k := len(l.files) - 1; k >= 0; k-- {
		name := l.path(l.files[k])
		found := false
		err := scanBack(name, func(line []byte) (bool, error) {
			e, err := ParseEntry(line)
			if err != nil {
				return false, fmt.Errorf("audit: %s: last records unreadable: %v", name, err)
			}
			if e.Node != l.opts.NodeID {
				return false, nil
			}
			if !e.VerifySig(l.pub) {
				return false, fmt.Errorf("%w (%s, node %s seq %d; key %s)", ErrKeyMismatch, name, e.Node, e.Seq, Fingerprint(l.pub))
			}
			l.seq, l.prev, found = e.Seq, LineHash(line), true
			return true, nil
		})
		if err != nil {
			return err
		}
		if found {
			l.seqNow.Store(l.seq)
			return nil
		}
	}
	return nil
}

// scanBack calls fn with each line of the file at path, last line first,
// until fn says stop or returns an error.
func scanBack(path string, fn func(line []byte) (bool, error)) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	off := st.Size()
	var carry []byte // the start of the line begun in the chunk read last
	first := true
	for off > 0 {
		n := min(int64(64<<10), off)
		off -= n
		data := make([]byte, n, int(n)+len(carry))
		if _, err := f.ReadAt(data, off); err != nil {
			return err
		}
		data = append(data, carry...)
		end := len(data)
		if first && end > 0 && data[end-1] == '\n' {
			end--
		}
		first = false
		for {
			j := bytes.LastIndexByte(data[:end], '\n')
			if j < 0 {
				break
			}
			if stop, err := fn(data[j+1 : end]); stop || err != nil {
				return err
			}
			end = j
		}
		carry = append([]byte(nil), data[:end]...)
		if len(carry) > MaxLineBytes {
			return fmt.Errorf("%s: line longer than %d bytes", path, MaxLineBytes)
		}
	}
	if len(carry) > 0 || !first {
		if _, err := fn(carry); err != nil {
			return err
		}
	}
	return nil
}

// create makes file i the active file (caller holds mu or is Open).
func (l *Log) create(i int) error {
	f, err := os.OpenFile(l.path(i), os.O_WRONLY|os.O_APPEND|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	syncDir(l.dir)
	l.f, l.size, l.dirty = f, 0, false
	if n := len(l.files); n == 0 || l.files[n-1] != i {
		l.files = append(l.files, i)
	}
	return nil
}

// openAppend makes the existing file i the active file.
func (l *Log) openAppend(i int) error {
	f, err := os.OpenFile(l.path(i), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("audit: %w", err)
	}
	l.f, l.size, l.dirty = f, st.Size(), false
	return nil
}

// rotate syncs and closes the active file and starts the next one, then
// applies retention (caller holds mu).
func (l *Log) rotate() error {
	if l.f != nil {
		if err := l.f.Sync(); err != nil {
			return err
		}
		if err := l.f.Close(); err != nil {
			return err
		}
		l.f = nil
	}
	next := 1
	if n := len(l.files); n > 0 {
		next = l.files[n-1] + 1
	}
	if err := l.create(next); err != nil {
		return err
	}
	l.retainLocked()
	return nil
}

// retain applies MaxFiles and MaxAge.
func (l *Log) retain() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.retainLocked()
}

func (l *Log) retainLocked() {
	if l.opts.MaxFiles <= 0 && l.opts.MaxAge <= 0 {
		return
	}
	now := time.Now()
	keep := l.files[:0:0]
	removedAny := false
	for k, i := range l.files {
		last := k == len(l.files)-1 // the active file stays
		drop := !last && l.opts.MaxFiles > 0 && len(l.files)-k > l.opts.MaxFiles
		if !last && !drop && l.opts.MaxAge > 0 {
			if st, err := os.Stat(l.path(i)); err == nil && now.Sub(st.ModTime()) > l.opts.MaxAge {
				drop = true
			}
		}
		if drop {
			if err := os.Remove(l.path(i)); err != nil && !errors.Is(err, os.ErrNotExist) {
				l.log.Warn("audit: retention could not remove a file", "file", l.path(i), "err", err)
				keep = append(keep, i)
				continue
			}
			l.removed.Add(1)
			removedAny = true
			continue
		}
		keep = append(keep, i)
	}
	l.files = keep
	if removedAny {
		syncDir(l.dir)
	}
}

// Export writes the records whose time is at or after since (zero: all)
// to w as JSON Lines, in log order across files: the lines exactly as
// stored, so they verify. Lines that do not parse are exported too, for
// Verify to report. Records still queued are not included; Flush first
// to include them.
func (l *Log) Export(since time.Time, w io.Writer) error {
	return l.ExportContext(context.Background(), since, w)
}

// ExportContext is Export stopping when ctx ends.
func (l *Log) ExportContext(ctx context.Context, since time.Time, w io.Writer) error {
	l.mu.Lock()
	files := append([]int(nil), l.files...)
	activeSize := l.size
	l.mu.Unlock()
	for k, i := range files {
		limit := int64(-1)
		if k == len(files)-1 {
			limit = activeSize
		}
		if err := exportFile(ctx, l.path(i), limit, since, w); err != nil {
			return err
		}
	}
	return nil
}

// exportFile streams one file's lines (up to limit bytes when >= 0).
func exportFile(ctx context.Context, path string, limit int64, since time.Time, w io.Writer) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil // removed by retention meanwhile
	}
	if err != nil {
		return err
	}
	defer f.Close()
	var r io.Reader = f
	if limit >= 0 {
		r = io.LimitReader(f, limit)
	}
	br := bufio.NewReaderSize(r, MaxLineBytes+1)
	for n := 0; ; n++ {
		if n%256 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// Too long to be a record: pass it through for Verify.
			if _, werr := w.Write(line); werr != nil {
				return werr
			}
			for errors.Is(err, bufio.ErrBufferFull) {
				if line, err = br.ReadSlice('\n'); len(line) > 0 {
					if _, werr := w.Write(line); werr != nil {
						return werr
					}
				}
			}
		} else if len(line) > 0 {
			if keepLine(line, since) {
				if _, werr := w.Write(line); werr != nil {
					return werr
				}
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return err
		}
	}
}

// keepLine reports whether an exported line passes the since filter.
func keepLine(line []byte, since time.Time) bool {
	if since.IsZero() {
		return true
	}
	e, err := ParseEntry(bytes.TrimSuffix(line, []byte{'\n'}))
	return err != nil || !e.Time.Before(since)
}
