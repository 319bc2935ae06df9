package consensus

import (
	"crypto/sha256"
	"log/slog"
	"os"

	pb "github.com/infermesh/infermesh/proto/gen/infermesh/consensus/v1"
)

// discardLogger logs to stderr when INFERMESH_TEST_LOG is set.
func discardLogger() *slog.Logger {
	if os.Getenv("INFERMESH_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// hashKey is the SHA-256 of a plaintext key, as node/auth.HashKey.
func hashKey(plaintext string) KeyHash { return sha256.Sum256([]byte(plaintext)) }

// The commands below are no longer issued by any API, but an old data
// directory's log may hold them, so the state machine still applies them.
// These build them the way the removed builders did.

// legacyKeyUpdate is a KeyUpdate command (once UpdateKey).
func legacyKeyUpdate(u *pb.KeyUpdate) (*Command, error) {
	return newCommand(pb.CommandType_COMMAND_TYPE_KEY_UPDATE, u)
}

// legacyNodePolicy is a PolicyNodeSet command (once SetNodePolicy, or
// RemoveNodePolicy with remove).
func legacyNodePolicy(np NodePolicy, remove bool) (*Command, error) {
	return newCommand(pb.CommandType_COMMAND_TYPE_POLICY_NODE_SET,
		&pb.PolicyNodeSet{Node: policyToProto(Policy{Nodes: []NodePolicy{np}}).Nodes[0], Remove: remove})
}

// legacyModelPolicy is a PolicyModelSet command (once SetModelPolicy, or
// RemoveModelPolicy with remove).
func legacyModelPolicy(mp ModelPolicy, remove bool) (*Command, error) {
	return newCommand(pb.CommandType_COMMAND_TYPE_POLICY_MODEL_SET,
		&pb.PolicyModelSet{Model: modelPolicyToProto(mp), Remove: remove})
}
