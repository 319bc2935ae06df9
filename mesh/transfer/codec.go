package transfer

import (
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	transferv1 "github.com/infermesh/infermesh/proto/gen/infermesh/transfer/v1"
)

// chunkCodec is the client's protobuf codec. It decodes a FetchFileResponse
// that carries only data into a buffer from its pool instead of a fresh
// one: a fresh 256 KiB slice per chunk (zeroed, then filled) was a sixth
// of the client's CPU in BenchmarkPeerTransfer. Every other message, and a
// data message with anything else in it, goes through proto.Unmarshal.
// Fetch hands each buffer back after writing it.
type chunkCodec struct {
	bufs sync.Pool // *[]byte
}

// Name is "proto": the codec replaces Connect's default binary codec.
func (*chunkCodec) Name() string { return "proto" }

// Marshal encodes a request.
func (*chunkCodec) Marshal(m any) ([]byte, error) { return proto.Marshal(m.(proto.Message)) }

// Unmarshal decodes a response.
func (c *chunkCodec) Unmarshal(b []byte, m any) error {
	if r, ok := m.(*transferv1.FetchFileResponse); ok {
		if data, ok := onlyData(b); ok {
			buf := c.get(len(data))
			r.Frame = &transferv1.FetchFileResponse_Data{Data: append(buf, data...)}
			return nil
		}
	}
	return proto.Unmarshal(b, m.(proto.Message))
}

// onlyData returns the payload of a message that is exactly one field 2
// (FetchFileResponse.data) of wire type bytes.
func onlyData(b []byte) ([]byte, bool) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 || num != 2 || typ != protowire.BytesType {
		return nil, false
	}
	data, m := protowire.ConsumeBytes(b[n:])
	if m < 0 || n+m != len(b) {
		return nil, false
	}
	return data, true
}

// get returns an empty buffer with room for n bytes.
func (c *chunkCodec) get(n int) []byte {
	if p, ok := c.bufs.Get().(*[]byte); ok && cap(*p) >= n {
		return (*p)[:0]
	}
	return make([]byte, 0, max(n, 256<<10))
}

// put gives back a buffer that get returned, once nothing refers to it.
func (c *chunkCodec) put(b []byte) {
	if cap(b) >= 256<<10 {
		c.bufs.Put(&b)
	}
}
