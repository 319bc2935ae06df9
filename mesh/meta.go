package mesh

import (
	"fmt"

	"github.com/hashicorp/memberlist"
	"google.golang.org/protobuf/proto"

	meshv1 "github.com/infermesh/infermesh/proto/gen/infermesh/mesh/v1"
)

// MaxMetaSize is the most NodeMeta may take on the wire (memberlist's limit).
const MaxMetaSize = memberlist.MetaMaxSize

// Identity is the stable part of a node that travels in memberlist's node
// metadata.
type Identity struct {
	// NodeID is the node's id (also its memberlist name).
	NodeID string
	// HTTPAddr is the client HTTP address peers and tools use.
	HTTPAddr string
	// RPCAddr is the Connect address peers dial.
	RPCAddr string
	// Version is the node's software version.
	Version string
}

// encodeMeta returns the NodeMeta bytes for id and checks the size limit.
func encodeMeta(id Identity) ([]byte, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(&meshv1.NodeMeta{
		NodeId:   id.NodeID,
		HttpAddr: id.HTTPAddr,
		RpcAddr:  id.RPCAddr,
		Version:  id.Version,
	})
	if err != nil {
		return nil, fmt.Errorf("mesh: encode node meta: %w", err)
	}
	if len(b) > MaxMetaSize {
		return nil, fmt.Errorf("mesh: node meta is %d bytes, the limit is %d (shorten the node id, addresses or version)", len(b), MaxMetaSize)
	}
	return b, nil
}

// decodeMeta parses NodeMeta bytes. The memberlist name is authoritative
// for the node id (they are equal for every node this package starts).
func decodeMeta(name string, b []byte) Identity {
	var m meshv1.NodeMeta
	if err := proto.Unmarshal(b, &m); err != nil {
		return Identity{NodeID: name}
	}
	return Identity{NodeID: name, HTTPAddr: m.GetHttpAddr(), RPCAddr: m.GetRpcAddr(), Version: m.GetVersion()}
}
