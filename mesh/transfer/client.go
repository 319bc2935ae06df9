package transfer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/infermesh/infermesh/mesh/peerauth"
	transferv1 "github.com/infermesh/infermesh/proto/gen/infermesh/transfer/v1"
	"github.com/infermesh/infermesh/proto/gen/infermesh/transfer/v1/transferv1connect"
)

// Client fetches manifests and files from peers. It is safe for
// concurrent use.
type Client struct {
	nodeID string
	sign   *peerauth.Signer
	http   *http.Client
	codec  *chunkCodec

	mu    sync.Mutex
	peers map[string]transferv1connect.TransferServiceClient
}

// ClientOption configures a Client.
type ClientOption func(*http.Transport)

// WithDialer opens connections to peers with dial instead of a plain TCP
// dial (the node passes a mutual-TLS dialer speaking ALPN http/1.1; URLs
// stay http://).
func WithDialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) ClientOption {
	return func(tr *http.Transport) { tr.DialContext = dial }
}

// NewClient builds a Client that signs every call with a key derived from
// secret (mesh/peerauth); the secret itself is never sent.
func NewClient(nodeID, secret string, opts ...ClientOption) (*Client, error) {
	if secret == "" {
		return nil, errors.New("transfer: a cluster secret is required")
	}
	sign, err := peerauth.NewSigner(secret, peerauth.Options{})
	if err != nil {
		return nil, err
	}
	p := new(http.Protocols)
	p.SetHTTP1(true)
	tr := &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		Protocols:             p,
		MaxIdleConnsPerHost:   8,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 10 * time.Second,
		DisableCompression:    true,
		ReadBufferSize:        256 << 10,
		WriteBufferSize:       64 << 10,
	}
	for _, o := range opts {
		o(tr)
	}
	return &Client{nodeID: nodeID, sign: sign, http: &http.Client{Transport: tr}, codec: &chunkCodec{}, peers: map[string]transferv1connect.TransferServiceClient{}}, nil
}

func (c *Client) peer(addr string) transferv1connect.TransferServiceClient {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.peers[addr]
	if !ok {
		p = transferv1connect.NewTransferServiceClient(c.http, "http://"+addr, connect.WithReadMaxBytes(8<<20), connect.WithCodec(c.codec),
			connect.WithInterceptors(c.sign))
		c.peers[addr] = p
	}
	return p
}

// Manifest returns the manifest JSON of model on the peer at addr.
func (c *Client) Manifest(ctx context.Context, addr, model string) ([]byte, error) {
	req := connect.NewRequest(&transferv1.GetManifestRequest{ModelId: model})
	resp, err := c.peer(addr).GetManifest(ctx, req)
	if err != nil {
		return nil, err
	}
	return resp.Msg.GetManifestJson(), nil
}

// Fetch writes the bytes of one file from offset to w. It returns an error
// if the stream ends before the file does.
func (c *Client) Fetch(ctx context.Context, addr, model, file string, offset int64, w io.Writer) error {
	req := connect.NewRequest(&transferv1.FetchFileRequest{ModelId: model, File: file, Offset: offset, RequesterNodeId: c.nodeID})
	stream, err := c.peer(addr).FetchFile(ctx, req)
	if err != nil {
		return err
	}
	defer stream.Close()
	if !stream.Receive() {
		if err := stream.Err(); err != nil {
			return err
		}
		return errors.New("transfer: stream ended before the file info")
	}
	info := stream.Msg().GetInfo()
	if info == nil || info.GetOffset() != offset {
		return errors.New("transfer: the first frame is not the file info for this offset")
	}
	got := offset
	for stream.Receive() {
		data := stream.Msg().GetData()
		_, err := w.Write(data)
		c.codec.put(data) // w is done with it; the message is not read again
		if err != nil {
			return err
		}
		got += int64(len(data))
	}
	if err := stream.Err(); err != nil {
		return err
	}
	if got != info.GetSize() {
		return fmt.Errorf("transfer: stream ended at byte %d of %d", got, info.GetSize())
	}
	return nil
}

// Close drops idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }
