package main

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"text/tabwriter"

	"github.com/infermesh/infermesh/node"
)

const raftUsage = `infermesh raft: inspect and repair the raft configuration.

  infermesh raft peers [--node URL]
      the raft servers as that node knows them: voters, non-voters, leader.
  infermesh raft remove-peer [--node URL] ID
      remove a server that is gone for good, through the leader (admin key
      from SERVICE_ADMIN_KEY). A node that is still running is added back as
      a non-voter; stop it first.
  infermesh raft recover --data-dir DIR [--node-id ID] --yes
      for a cluster that lost its majority for good (in a two-node mesh: the
      one voter died). Run it on a STOPPED node; it rewrites that node's raft
      state so that it restarts as the single voter, and writes resume.

      WARNING: every entry in this node's log counts as committed, and any
      write only the lost servers had is gone. Never restart a lost server
      with its old data directory: it still believes in the old
      configuration and would form a second cluster. Delete its data
      directory's raft/ folder first; it then joins as a new server.
`

// raftCmd runs `infermesh raft ...`.
func raftCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, raftUsage)
		return 2
	}
	sub := args[0]
	f := newEnvFlags("raft " + sub)
	f.fs.SetOutput(stderr)
	switch sub {
	case "peers", "remove-peer":
		base := nodeFlag(f)
		format := formatFlag(f)
		pos, err := parseInterleaved(f, args[1:])
		if err != nil {
			return parseExit(err)
		}
		if err := checkFormat(*format); err != nil {
			fmt.Fprintf(stderr, "infermesh raft %s: %v\n", sub, err)
			return 2
		}
		if sub == "peers" && len(pos) == 0 {
			if *format == "json" {
				var raw any
				if err := adminCall(*base, http.MethodGet, "/v1/server/raft/peers", nil, &raw); err != nil {
					fmt.Fprintf(stderr, "infermesh raft peers: %v\n", err)
					return 1
				}
				printJSON(stdout, raw)
				return 0
			}
			return raftPeers(*base, stdout, stderr)
		}
		if sub == "remove-peer" && len(pos) == 1 {
			id := pos[0]
			if err := adminCall(*base, http.MethodDelete, "/v1/server/raft/peers/"+url.PathEscape(id), nil, nil); err != nil {
				fmt.Fprintf(stderr, "infermesh raft remove-peer: %v\n", err)
				return 1
			}
			fmt.Fprintf(stdout, "removed %s from the raft configuration\n", id)
			return 0
		}
	case "recover":
		cfg := node.Defaults()
		f.String(&cfg.DataDir, "data-dir", "SERVICE_DATA_DIR", cfg.DataDir, "data directory of the stopped node")
		f.String(&cfg.NodeID, "node-id", "SERVICE_NODE_ID", cfg.NodeID, "that node's id (default: host name, as serve)")
		yes := f.fs.Bool("yes", false, "confirm: you read the warning in `infermesh raft -h`")
		if err := f.Parse(args[1:]); err != nil {
			if code := parseExit(err); code != 0 {
				fmt.Fprintf(stderr, "infermesh raft recover: %v\n", err)
				return code
			}
			return 0
		}
		return raftRecover(cfg.DataDir, cfg.NodeID, *yes, stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, raftUsage)
		return 0
	}
	fmt.Fprint(stderr, raftUsage)
	return 2
}

func raftPeers(base string, stdout, stderr io.Writer) int {
	var st struct {
		Node   string `json:"node"`
		Leader string `json:"leader"`
		Data   []struct {
			ID       string `json:"id"`
			Address  string `json:"address"`
			Suffrage string `json:"suffrage"`
			Leader   bool   `json:"leader"`
		} `json:"data"`
	}
	if err := adminCall(base, http.MethodGet, "/v1/server/raft/peers", nil, &st); err != nil {
		fmt.Fprintf(stderr, "infermesh raft peers: %v\n", err)
		return 1
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tADDRESS\tSUFFRAGE\tLEADER")
	for _, p := range st.Data {
		leader := ""
		if p.Leader {
			leader = "leader"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", p.ID, p.Address, p.Suffrage, leader)
	}
	tw.Flush()
	if st.Leader == "" {
		fmt.Fprintf(stdout, "\n%s knows no leader: no majority of voters is reachable. If the missing voters are gone for good, see `infermesh raft -h` (recover).\n", st.Node)
	}
	return 0
}

func raftRecover(dataDir, nodeID string, yes bool, stdout, stderr io.Writer) int {
	fmt.Fprintf(stderr, "WARNING: recovering %s (node %s) as the single raft voter.\n"+
		"  Every entry in its log counts as committed; writes only the lost servers had are lost.\n"+
		"  Never restart a lost server with its old data: delete its raft/ folder first.\n", dataDir, nodeID)
	if !yes {
		fmt.Fprintln(stderr, "Nothing changed. Run again with --yes to proceed.")
		return 2
	}
	res, err := node.RecoverRaft(dataDir, nodeID, slog.New(slog.DiscardHandler))
	if err != nil {
		fmt.Fprintf(stderr, "infermesh raft recover: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "raft configuration before recovery:\n")
	for _, s := range res.Before {
		suffrage := "nonvoter"
		if s.Voter {
			suffrage = "voter"
		}
		fmt.Fprintf(stdout, "  %s %s %s\n", s.ID, s.Address, suffrage)
	}
	fmt.Fprintf(stdout, "recovered: %s is now the only voter (state up to log index %d). Start the node again.\n", nodeID, res.AppliedIndex)
	return 0
}
