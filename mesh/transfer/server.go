// Package transfer moves installed model files between nodes over Connect:
// a server-streaming FetchFile that resumes from an offset, and
// GetManifest. It knows nothing of the model store; the node hands the
// server a Files implementation and gives the client's results to the
// puller in node/models.
package transfer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/infermesh/infermesh/mesh/peerauth"
	transferv1 "github.com/infermesh/infermesh/proto/gen/infermesh/transfer/v1"
	"github.com/infermesh/infermesh/proto/gen/infermesh/transfer/v1/transferv1connect"
)

// ErrNotFound is what Files returns for an unknown model or file.
var ErrNotFound = errors.New("transfer: no such model or file")

// Files gives the server read access to installed models (the node's model
// store implements it through a small adapter).
type Files interface {
	// Manifest returns the manifest JSON of an installed model.
	Manifest(model string) ([]byte, error)
	// Open opens one file of an installed model and returns its size and
	// recorded sha256.
	Open(model, file string) (f io.ReadSeekCloser, size int64, sha256 string, err error)
}

// ServerConfig configures a Server.
type ServerConfig struct {
	// NodeID is this node's id, for logs.
	NodeID string
	// ClusterSecret keys the signatures every caller must present
	// (mesh/peerauth). Required unless Verifier is set.
	ClusterSecret string
	// Verifier authenticates callers instead of a peerauth.Verifier built
	// from ClusterSecret (the node shares one between its services).
	Verifier connect.Interceptor
	// ChunkSize is the data carried by one message. Default 256 KiB.
	ChunkSize int
	// RateBytes caps the bytes per second this node sends to all peers
	// together; 0 means no cap.
	RateBytes int64
}

// Server serves TransferService.
type Server struct {
	cfg      ServerConfig
	files    Files
	log      *slog.Logger
	limit    *rate.Limiter
	path     string
	handler  http.Handler
	draining atomic.Bool
	sent     prometheus.Counter
	streams  prometheus.Gauge
	bufs     sync.Pool
}

// NewServer builds a Server over files.
func NewServer(cfg ServerConfig, files Files, logger *slog.Logger, reg prometheus.Registerer) (*Server, error) {
	verify := cfg.Verifier
	if verify == nil {
		if cfg.ClusterSecret == "" {
			return nil, errors.New("transfer: a cluster secret is required")
		}
		v, err := peerauth.NewVerifier(cfg.ClusterSecret, peerauth.Options{})
		if err != nil {
			return nil, err
		}
		verify = v
	}
	if cfg.ChunkSize <= 0 {
		cfg.ChunkSize = 256 << 10
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, files: files, log: logger.With("component", "transfer", "node", cfg.NodeID)}
	s.bufs.New = func() any { b := make([]byte, cfg.ChunkSize); return &b }
	if cfg.RateBytes > 0 {
		s.limit = rate.NewLimiter(rate.Limit(cfg.RateBytes), max(cfg.ChunkSize, int(min(cfg.RateBytes, 1<<30))))
	}
	s.sent = prometheus.NewCounter(prometheus.CounterOpts{Name: "infermesh_transfer_sent_bytes_total", Help: "Model file bytes sent to peers."})
	s.streams = prometheus.NewGauge(prometheus.GaugeOpts{Name: "infermesh_transfer_streams", Help: "Model file streams being sent to peers now."})
	if reg != nil {
		for _, c := range []prometheus.Collector{s.sent, s.streams} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	s.path, s.handler = transferv1connect.NewTransferServiceHandler(&service{s: s},
		connect.WithInterceptors(verify),
		connect.WithCompression("gzip", nil, nil),
	)
	return s, nil
}

// Handler returns the path prefix and handler for the RPC mux.
func (s *Server) Handler() (string, http.Handler) { return s.path, s.handler }

// SetDraining makes new calls fail with UNAVAILABLE (streams already
// running go on until the node stops).
func (s *Server) SetDraining(on bool) { s.draining.Store(on) }

type service struct{ s *Server }

func (v *service) GetManifest(ctx context.Context, req *connect.Request[transferv1.GetManifestRequest]) (*connect.Response[transferv1.GetManifestResponse], error) {
	if v.s.draining.Load() {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("draining"))
	}
	b, err := v.s.files.Manifest(req.Msg.GetModelId())
	if err != nil {
		return nil, codeOf(err)
	}
	return connect.NewResponse(&transferv1.GetManifestResponse{ManifestJson: b}), nil
}

func (v *service) FetchFile(ctx context.Context, req *connect.Request[transferv1.FetchFileRequest], stream *connect.ServerStream[transferv1.FetchFileResponse]) error {
	s := v.s
	if s.draining.Load() {
		return connect.NewError(connect.CodeUnavailable, errors.New("draining"))
	}
	m := req.Msg
	f, size, sum, err := s.files.Open(m.GetModelId(), m.GetFile())
	if err != nil {
		return codeOf(err)
	}
	defer f.Close()
	off := m.GetOffset()
	if off < 0 || off > size {
		return connect.NewError(connect.CodeOutOfRange, fmt.Errorf("offset %d outside the file's %d bytes", off, size))
	}
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return connect.NewError(connect.CodeInternal, err)
	}
	s.streams.Inc()
	defer s.streams.Dec()
	s.log.Debug("sending model file", "model", m.GetModelId(), "file", m.GetFile(), "offset", off, "to", m.GetRequesterNodeId())
	if err := stream.Send(&transferv1.FetchFileResponse{Frame: &transferv1.FetchFileResponse_Info{Info: &transferv1.FileInfo{Size: size, Sha256: sum, Offset: off}}}); err != nil {
		return err
	}
	bp := s.bufs.Get().(*[]byte)
	defer s.bufs.Put(bp)
	buf := *bp
	msg := &transferv1.FetchFileResponse{}
	data := &transferv1.FetchFileResponse_Data{}
	for {
		n, rerr := io.ReadFull(f, buf)
		if n > 0 {
			if s.limit != nil {
				if err := s.limit.WaitN(ctx, n); err != nil {
					return err
				}
			}
			data.Data = buf[:n]
			msg.Frame = data
			if err := stream.Send(msg); err != nil {
				return err
			}
			s.sent.Add(float64(n))
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			return nil
		}
		if rerr != nil {
			return connect.NewError(connect.CodeInternal, rerr)
		}
	}
}

func codeOf(err error) error {
	if errors.Is(err, ErrNotFound) {
		return connect.NewError(connect.CodeNotFound, err)
	}
	return connect.NewError(connect.CodeInternal, err)
}
