package audit

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of Options.
const (
	DefaultMaxFileBytes = 64 << 20
	DefaultQueueSize    = 8192
	// maxBatch is the most records the writer encodes into one write.
	maxBatch = 512
	// retentionEvery is how often the writer applies retention besides at
	// open and after each rotation.
	retentionEvery = time.Minute
)

// ErrKeyMismatch is wrapped by Open's error when the last record this
// node wrote does not verify with the key it was opened with (the key
// file was replaced or the log belongs to another key).
var ErrKeyMismatch = errors.New("audit: the log's last record was not signed by this key")

// ErrClosed is returned by Flush after Close.
var ErrClosed = errors.New("audit: log closed")

// Options configure a Log.
type Options struct {
	// NodeID names this node's chain; required.
	NodeID string
	// Key signs the records; required (LoadOrCreateKey).
	Key ed25519.PrivateKey
	// MaxFileBytes starts a new file when the next record would pass it
	// (0: DefaultMaxFileBytes).
	MaxFileBytes int64
	// MaxAge removes a file (never the one being written) once its last
	// write is older than this (0: no age limit).
	MaxAge time.Duration
	// MaxFiles keeps at most this many files, the one being written
	// included, removing the oldest (0: no count limit).
	MaxFiles int
	// QueueSize bounds the records waiting for the writer; Append drops
	// and counts records beyond it (0: DefaultQueueSize).
	QueueSize int
	// SyncInterval is the fsync policy: 0 syncs after every batch write,
	// > 0 at most once per interval (and at rotation, Flush and Close),
	// < 0 only at rotation, Flush and Close.
	SyncInterval time.Duration
	// Logger receives recovery and write-error reports (nil: discarded).
	Logger *slog.Logger
	// Clock stamps records that come without a time (nil: time.Now).
	Clock func() time.Time
}

// Stats are a Log's counters, ready for metrics.
type Stats struct {
	// Written counts records written to the file.
	Written uint64
	// Dropped counts records Append refused (queue full or log closed).
	Dropped uint64
	// WriteFailed counts records lost to write errors (disk full, ...).
	WriteFailed uint64
	// Removed counts files removed by retention.
	Removed uint64
	// TornBytes is how many bytes of a torn last line Open truncated.
	TornBytes int64
	// Seq is the sequence number of the last record written.
	Seq uint64
	// Files is the number of log files.
	Files int
}

// Log is a node's append-only, signed, hash-chained audit log. Append is
// safe from any goroutine and never blocks; one writer goroutine assigns
// sequence numbers, chains, signs and writes.
type Log struct {
	dir  string
	opts Options
	log  *slog.Logger
	pub  ed25519.PublicKey

	queue  chan Record
	flushc chan chan error
	stop   chan struct{}
	done   chan struct{}

	// closeMu orders Append against Close: Append holds it for reading.
	closeMu sync.RWMutex
	closed  bool

	// mu guards the file set and the active file's size, which Export
	// snapshots while the writer writes.
	mu     sync.Mutex
	files  []int // indexes of the files on disk, ascending
	f      *os.File
	size   int64
	dirty  bool // written since the last fsync
	werr   error
	closeE error

	// Writer-goroutine state: the chain head.
	seq  uint64
	prev [32]byte
	buf  []byte

	written, dropped, writeFailed, removed atomic.Uint64
	seqNow                                 atomic.Uint64
	torn                                   int64
}

// Open opens (or creates) the log in dir, recovers it and starts the
// writer. Recovery truncates a torn last line (reported in Stats and the
// log), then continues this node's chain from its last record on disk,
// which must parse and verify with opts.Key (else the error wraps
// ErrKeyMismatch or describes the bad record; the log is not opened).
func Open(dir string, opts Options) (*Log, error) {
	if opts.NodeID == "" {
		return nil, errors.New("audit: Options.NodeID is required")
	}
	if len(opts.Key) != ed25519.PrivateKeySize {
		return nil, errors.New("audit: Options.Key is required")
	}
	if opts.MaxFileBytes <= 0 {
		opts.MaxFileBytes = DefaultMaxFileBytes
	}
	if opts.QueueSize <= 0 {
		opts.QueueSize = DefaultQueueSize
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	l := &Log{
		dir: dir, opts: opts, log: logger,
		pub:    opts.Key.Public().(ed25519.PublicKey),
		queue:  make(chan Record, opts.QueueSize),
		flushc: make(chan chan error),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	if err := l.recover(); err != nil {
		return nil, err
	}
	l.retain()
	go l.run()
	return l, nil
}

// PublicKey is the key records are verified with.
func (l *Log) PublicKey() ed25519.PublicKey { return l.pub }

// Append queues r for the log and returns at once: true when queued,
// false when the queue is full or the log closed (counted in
// Stats.Dropped). Vision records keep only endpoint, model, status and
// timing; strings are cut to MaxFieldBytes.
func (l *Log) Append(r Record) bool {
	r = r.normalize(l.opts.Clock())
	l.closeMu.RLock()
	defer l.closeMu.RUnlock()
	if l.closed {
		l.dropped.Add(1)
		return false
	}
	select {
	case l.queue <- r:
		return true
	default:
		l.dropped.Add(1)
		return false
	}
}

// Flush waits until every record queued before the call is written and
// synced, and returns the first write error since the last Flush.
func (l *Log) Flush(ctx context.Context) error {
	ack := make(chan error, 1)
	select {
	case l.flushc <- ack:
	case <-l.done:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-ack:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close stops accepting records, writes and syncs the queued ones and
// closes the file. Later calls return the first call's result.
func (l *Log) Close() error {
	l.closeMu.Lock()
	first := !l.closed
	l.closed = true
	l.closeMu.Unlock()
	if first {
		close(l.stop)
	}
	<-l.done
	return l.closeE
}

// Stats returns the log's counters.
func (l *Log) Stats() Stats {
	l.mu.Lock()
	files := len(l.files)
	l.mu.Unlock()
	return Stats{
		Written: l.written.Load(), Dropped: l.dropped.Load(), WriteFailed: l.writeFailed.Load(),
		Removed: l.removed.Load(), TornBytes: l.torn, Seq: l.seqNow.Load(), Files: files,
	}
}

// Collectors returns Prometheus collectors over Stats:
// infermesh_audit_records_total{result="written|dropped|write_failed"}
// and infermesh_audit_files. The caller registers them.
func (l *Log) Collectors() []prometheus.Collector {
	counter := func(result string, v *atomic.Uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "infermesh_audit_records_total",
			Help:        "Audit records by result: written, dropped (queue full, never blocking a request) or write_failed.",
			ConstLabels: prometheus.Labels{"result": result},
		}, func() float64 { return float64(v.Load()) })
	}
	files := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "infermesh_audit_files",
		Help: "Audit log files on disk.",
	}, func() float64 { return float64(l.Stats().Files) })
	return []prometheus.Collector{
		counter("written", &l.written), counter("dropped", &l.dropped),
		counter("write_failed", &l.writeFailed), files,
	}
}

// run is the writer goroutine.
func (l *Log) run() {
	defer close(l.done)
	var syncTick <-chan time.Time
	if l.opts.SyncInterval > 0 {
		t := time.NewTicker(l.opts.SyncInterval)
		defer t.Stop()
		syncTick = t.C
	}
	retainTick := time.NewTicker(retentionEvery)
	defer retainTick.Stop()
	batch := make([]Record, 0, maxBatch)
	for {
		select {
		case r := <-l.queue:
			batch = l.fill(append(batch[:0], r), maxBatch)
			l.write(batch)
			if l.opts.SyncInterval == 0 {
				l.sync()
			}
		case ack := <-l.flushc:
			l.drain(batch)
			l.sync()
			l.mu.Lock()
			err := l.werr
			l.werr = nil
			l.mu.Unlock()
			ack <- err
		case <-syncTick:
			l.sync()
		case <-retainTick.C:
			l.retain()
		case <-l.stop:
			l.drain(batch)
			l.sync()
			l.mu.Lock()
			if l.f != nil {
				if err := l.f.Close(); err != nil && l.closeE == nil {
					l.closeE = err
				}
				l.f = nil
			}
			if l.closeE == nil {
				l.closeE = l.werr
			}
			l.mu.Unlock()
			return
		}
	}
}

// fill adds queued records to batch without waiting, up to n.
func (l *Log) fill(batch []Record, n int) []Record {
	for len(batch) < n {
		select {
		case r := <-l.queue:
			batch = append(batch, r)
		default:
			return batch
		}
	}
	return batch
}

// drain writes everything queued now.
func (l *Log) drain(batch []Record) {
	for {
		batch = l.fill(batch[:0], maxBatch)
		if len(batch) == 0 {
			return
		}
		l.write(batch)
	}
}

// write chains, signs and writes a batch: one write call per file
// touched. On a write error the file is cut back to its size before that
// write and the chain head restored, so the file never holds a partial
// line or a gap; the records are counted in WriteFailed.
func (l *Log) write(batch []Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil { // an earlier rotation failed: try again
		if err := l.rotate(); err != nil {
			l.failed(len(batch), err, l.seq, l.prev)
			return
		}
	}
	buf := l.buf[:0]
	startSeq, startPrev, pending := l.seq, l.prev, 0
	flush := func() bool {
		if len(buf) == 0 {
			return true
		}
		if l.f == nil {
			l.failed(pending, errors.New("no open file"), startSeq, startPrev)
			return false
		}
		n, err := l.f.Write(buf)
		if err != nil {
			if n > 0 {
				l.f.Truncate(l.size)
			}
			// The next write starts a new file (the chain continues).
			l.f.Close()
			l.f = nil
			l.failed(pending, err, startSeq, startPrev)
			return false
		}
		l.size += int64(n)
		l.dirty = true
		l.written.Add(uint64(pending))
		l.seqNow.Store(l.seq)
		buf, startSeq, startPrev, pending = buf[:0], l.seq, l.prev, 0
		return true
	}
	for i := range batch {
		e := Entry{Record: batch[i], Node: l.opts.NodeID, Seq: l.seq + 1, Prev: l.prev}
		start := len(buf)
		buf = e.Sign(l.opts.Key, buf)
		line := buf[start:]
		if l.size+int64(len(buf))+1 > l.opts.MaxFileBytes && l.size+int64(start) > 0 {
			saved := append([]byte(nil), line...)
			buf = buf[:start]
			if !flush() {
				l.buf = buf
				l.failedRest(batch[i:])
				return
			}
			if err := l.rotate(); err != nil {
				l.failed(len(batch)-i, err, l.seq, l.prev)
				l.buf = buf
				return
			}
			buf = append(buf[:0], saved...)
			line = buf
		}
		buf = append(buf, '\n')
		l.prev = LineHash(line)
		l.seq++
		pending++
	}
	flush()
	l.buf = buf[:0]
}

// failed restores the chain head after a failed write of n records.
func (l *Log) failed(n int, err error, seq uint64, prev [32]byte) {
	l.seq, l.prev = seq, prev
	l.writeFailed.Add(uint64(n))
	if l.werr == nil {
		l.werr = err
	}
	l.log.Error("audit: write failed; records lost", "records", n, "err", err)
}

// failedRest counts the records of a batch left unwritten after a failure.
func (l *Log) failedRest(rest []Record) {
	l.writeFailed.Add(uint64(len(rest)))
}

// sync fsyncs the active file if it was written since the last sync.
func (l *Log) sync() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.dirty || l.f == nil {
		return
	}
	if err := l.f.Sync(); err != nil {
		if l.werr == nil {
			l.werr = err
		}
		l.log.Error("audit: fsync failed", "err", err)
		return
	}
	l.dirty = false
}
