package main

import (
	"context"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// nodeNames maps node ids to node names, so that human output shows the
// name an operator gave a node beside the id the cluster gave it. A nil
// map knows no names.
type nodeNames map[string]string

// label returns "name (id)" for a node with a known name other than its
// id, else the id as it is. The caller passes it through display.
func (n nodeNames) label(id string) string {
	if name := n[id]; name != "" && name != id {
		return name + " (" + id + ")"
	}
	return id
}

// labels applies label to each id.
func (n nodeNames) labels(ids []string) []string {
	if len(ids) == 0 {
		return ids
	}
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = n.label(id)
	}
	return out
}

// volumeNames returns the names of the nodes, when v names a node
// anywhere its status prints one (a claim, its controller, an expansion's
// nodes), and nil without a call otherwise.
func volumeNames(ctx context.Context, cl csisupdv1.ControlClient, v *csisupdv1.Volume, stale bool) nodeNames {
	if len(v.GetClaims()) == 0 && v.GetControllerNodeId() == "" &&
		len(v.GetExpansion().GetNodesPending()) == 0 && len(v.GetExpansion().GetNodesDone()) == 0 {
		return nil
	}
	return listNodeNames(ctx, cl, stale)
}

// listNodeNames lists the cluster's nodes (one ListNodes call per page)
// and returns their names by id. The names only decorate the output: a
// listing that fails, for example for a token that may read volumes but
// not nodes, gives no names and no error, and the ids print alone.
func listNodeNames(ctx context.Context, cl csisupdv1.ControlClient, stale bool) nodeNames {
	names := nodeNames{}
	err := listAllPages(func(token string) (string, error) {
		page, err := cl.ListNodes(ctx, &csisupdv1.NodeListRequest{Stale: stale, NextToken: token})
		if err != nil {
			return "", err
		}
		for _, n := range page.GetNodes() {
			names[n.GetId()] = n.GetName()
		}
		return page.GetNextToken(), nil
	})
	if err != nil {
		return nil
	}
	return names
}
