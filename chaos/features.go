package chaos

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Need is something a scenario or checker needs from the binary or the
// machine. Each maps to one Features field, so switching a coming feature
// on is a matter of the binary growing it: detection is automatic.
type Need string

// Needs.
const (
	// NeedMesh: serve has --gossip-listen, --rpc-listen, --join, --cluster-secret.
	NeedMesh Need = "mesh"
	// NeedPartitions: root in the namespace and a working iptables.
	NeedPartitions Need = "partitions"
	// NeedDigest: GET /v1/server/state-digest (leader, digest, applied index).
	NeedDigest Need = "state-digest"
	// NeedMembers: GET /v1/server/members.
	NeedMembers Need = "members"
	// NeedKeys: the key admin API under /v1/server/keys.
	NeedKeys Need = "keys"
)

// meshFlags are the serve flags the mesh contract promises.
func meshFlags() []string {
	return []string{"gossip-listen", "rpc-listen", "join", "cluster-secret", "gossip-key", "voters"}
}

// Features is what the binary and the machine can do.
type Features struct {
	// Mesh is true when serve -h lists every mesh flag (NeedMesh).
	Mesh bool `json:"mesh"`
	// MissingFlags are the mesh flags serve -h does not list.
	MissingFlags []string `json:"missing_flags,omitempty"`
	// Partitions is true when iptables works in the namespace (root), so
	// partition scenarios can run.
	Partitions bool `json:"partitions"`
	// NoPartitionWhy says why Partitions is false.
	NoPartitionWhy string `json:"no_partition_why,omitempty"`
	// Digest is true when a probe node serves GET /v1/server/state-digest.
	Digest bool `json:"state_digest"`
	// Members is true when a probe node serves GET /v1/server/members.
	Members bool `json:"members"`
	// Keys is true when a probe node serves the key admin API
	// (/v1/server/keys).
	Keys bool `json:"keys"`
	// Standalone is set when the operator asked to run mesh scenarios on
	// independent nodes (harness development; says nothing about the mesh).
	Standalone bool `json:"standalone,omitempty"`
}

// Has reports whether a need is met.
func (f Features) Has(n Need) bool {
	switch n {
	case NeedMesh:
		return f.Mesh || f.Standalone
	case NeedPartitions:
		return f.Partitions
	case NeedDigest:
		return f.Digest
	case NeedMembers:
		return f.Members
	case NeedKeys:
		return f.Keys
	}
	return false
}

// Missing returns the needs that are not met.
func (f Features) Missing(needs []Need) []Need {
	var out []Need
	for _, n := range needs {
		if !f.Has(n) {
			out = append(out, n)
		}
	}
	return out
}

// DetectFlags reads `bin serve -h` and reports which mesh flags are missing.
func DetectFlags(ctx context.Context, bin string) (missing []string, err error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, bin, "serve", "-h").CombinedOutput() // -h exits non-zero
	text := string(out)
	if !strings.Contains(text, "-listen") {
		return nil, fmt.Errorf("%s serve -h printed no flag list: %.300s", bin, text)
	}
	for _, f := range meshFlags() {
		if !strings.Contains(text, "-"+f+" ") && !strings.Contains(text, "-"+f+"\n") {
			missing = append(missing, f)
		}
	}
	return missing, nil
}

// ProbeHTTP starts one throwaway node (a mesh of one when the mesh flags
// exist) in dir and asks it which coming endpoints it serves; with sec
// the node runs secured as the scenarios will.
func ProbeHTTP(ctx context.Context, f *Features, bin, dir string, models []string, adminKey string, sec *Security) error {
	cfg := ClusterConfig{Bin: bin, Nodes: 1, Dir: dir, Models: models, Mesh: f.Mesh, AdminKey: adminKey,
		ClusterSecret: "probe-secret", StartTimeout: 60 * time.Second, Security: sec}
	c, err := NewCluster(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		c.Close()
		os.RemoveAll(filepath.Join(dir, "n1"))
	}()
	if err := c.Start(ctx); err != nil {
		return fmt.Errorf("probe node: %w", err)
	}
	api := NewAPI(NewControlClient(5*time.Second, sec.ClientTLS()), adminKey)
	base := c.Node("n1").BaseURL()
	ok := func(path string) bool {
		// A mesh of one may need a moment to elect itself.
		for range 20 {
			res, err := api.Do(ctx, http.MethodGet, base+path, "", nil)
			if err == nil && res.Status == http.StatusOK {
				return true
			}
			if err == nil && (res.Status == http.StatusNotFound || res.Status == http.StatusMethodNotAllowed) {
				return false
			}
			time.Sleep(250 * time.Millisecond)
		}
		return false
	}
	f.Digest = ok("/v1/server/state-digest")
	f.Members = ok("/v1/server/members")
	f.Keys = ok("/v1/server/keys")
	return nil
}

// needsList renders needs for messages.
func needsList(needs []Need) string {
	s := make([]string, len(needs))
	for i, n := range needs {
		s[i] = string(n)
	}
	slices.Sort(s)
	return strings.Join(s, ", ")
}
