package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/safefile"
)

// withACL calls fn with an ACL client (see withClient).
func (o *clientOptions) withACL(parent context.Context, fn func(context.Context, csisupdv1.ACLClient) error) error {
	return withClient(o, parent, csisupdv1.NewACLClient, fn)
}

func newACLCommand(opts *clientOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "acl",
		Short: "Manage ACL tokens and policies (on a server)",
		Args:  rangeArgs(0, 0),
	}
	policy := &cobra.Command{Use: "policy", Short: "Manage ACL policies", Args: rangeArgs(0, 0)}
	policy.AddCommand(newACLPolicyApplyCommand(opts), newACLPolicyListCommand(opts),
		newACLPolicyInfoCommand(opts), newACLPolicyDeleteCommand(opts))
	token := &cobra.Command{Use: "token", Short: "Manage ACL tokens", Args: rangeArgs(0, 0)}
	token.AddCommand(newACLTokenCreateCommand(opts), newACLTokenListCommand(opts),
		newACLTokenInfoCommand(opts), newACLTokenDeleteCommand(opts), newACLTokenSelfCommand(opts))
	cmd.AddCommand(newACLBootstrapCommand(opts), policy, token)
	return cmd
}

func newACLBootstrapCommand(opts *clientOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "bootstrap",
		Short: "Create the cluster's first management token (once per cluster)",
		Long: "Create the cluster's first management token. It works once per cluster; the secret id is shown " +
			"only now: keep it safe. A second bootstrap is refused with the index to write into " +
			"<data_dir>/server/acl-bootstrap-reset on the leader to allow one more (see docs/security.md).",
		Args: rangeArgs(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return opts.withACL(cmd.Context(), func(ctx context.Context, cl csisupdv1.ACLClient) error {
				resp, err := cl.Bootstrap(ctx, &csisupdv1.ACLBootstrapRequest{})
				if err != nil {
					return controlError(opts.address, err)
				}
				return opts.printToken(cmd.OutOrStdout(), resp.GetToken())
			})
		},
	}
}

func newACLPolicyApplyCommand(opts *clientOptions) *cobra.Command {
	var description string
	cmd := &cobra.Command{
		Use:   "apply NAME FILE",
		Short: "Create or replace a policy from an HCL rules file (- reads stdin)",
		Args:  rangeArgs(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			rules, err := readRules(cmd.InOrStdin(), args[1])
			if err != nil {
				return err
			}
			return opts.withACL(cmd.Context(), func(ctx context.Context, cl csisupdv1.ACLClient) error {
				resp, err := cl.UpsertPolicy(ctx, &csisupdv1.ACLUpsertPolicyRequest{Policy: &csisupdv1.ACLPolicy{
					Name: args[0], Description: description, Rules: rules,
				}})
				if err != nil {
					return controlError(opts.address, err)
				}
				if opts.json {
					return printProto(cmd.OutOrStdout(), resp.GetPolicy())
				}
				fmt.Fprintf(cmd.OutOrStdout(), "Policy %q applied\n", display(resp.GetPolicy().GetName()))
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&description, "description", "", "what the policy is for")
	return cmd
}

// readRules reads a policy file, or stdin for "-".
func readRules(stdin io.Reader, file string) (string, error) {
	if file != "-" {
		data, err := safefile.Read(context.Background(), file, safefile.Spec{What: "policy rules", MaxSize: maxPolicyBytes})
		return string(data), err
	}
	data, err := io.ReadAll(io.LimitReader(stdin, maxPolicyBytes+1))
	switch {
	case err != nil:
		return "", fmt.Errorf("policy rules %s: %w", file, err)
	case len(data) > maxPolicyBytes:
		return "", fmt.Errorf("policy rules %s: larger than %d bytes", file, maxPolicyBytes)
	}
	return string(data), nil
}

// maxPolicyBytes caps a policy file, far above any real one.
const maxPolicyBytes = 64 << 10

func newACLPolicyListCommand(opts *clientOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the policies",
		Args:  rangeArgs(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return opts.withACL(cmd.Context(), func(ctx context.Context, cl csisupdv1.ACLClient) error {
				resp, err := cl.ListPolicies(ctx, &csisupdv1.ACLListPoliciesRequest{})
				if err != nil {
					return controlError(opts.address, err)
				}
				if opts.json {
					return printProto(cmd.OutOrStdout(), resp)
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tDESCRIPTION")
				for _, p := range resp.GetPolicies() {
					row(tw, p.GetName(), dash(p.GetDescription()))
				}
				return tw.Flush()
			})
		},
	}
}

func newACLPolicyInfoCommand(opts *clientOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "info NAME",
		Short: "Show a policy with its rules",
		Args:  rangeArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return opts.withACL(cmd.Context(), func(ctx context.Context, cl csisupdv1.ACLClient) error {
				resp, err := cl.GetPolicy(ctx, &csisupdv1.ACLGetPolicyRequest{Name: args[0]})
				if err != nil {
					return controlError(opts.address, err)
				}
				p := resp.GetPolicy()
				w := cmd.OutOrStdout()
				if opts.json {
					return printProto(w, p)
				}
				fmt.Fprintf(w, "Name        = %s\nDescription = %s\nModified    = %s\nRules:\n\n%s\n",
					display(p.GetName()), dash(p.GetDescription()), when(p.GetModifyTime()), displayLines(p.GetRules()))
				return nil
			})
		},
	}
}

func newACLPolicyDeleteCommand(opts *clientOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a policy; tokens that name it no longer get its rules",
		Args:  rangeArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return opts.withACL(cmd.Context(), func(ctx context.Context, cl csisupdv1.ACLClient) error {
				if _, err := cl.DeletePolicy(ctx, &csisupdv1.ACLDeletePolicyRequest{Name: args[0]}); err != nil {
					return controlError(opts.address, err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "Policy %q deleted\n", display(args[0]))
				return nil
			})
		},
	}
}

func newACLTokenCreateCommand(opts *clientOptions) *cobra.Command {
	var name, typ, nodeIdentity string
	var policies []string
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create a token; its secret id is shown only now",
		Long: `Create a token; its secret id is shown only now.

With --node-identity NAME the token acts as node NAME only, as Consul's node
identities do: it allows what an agent needs for its calls to the servers
(node:write) without any policy, and the servers refuse its calls for any
other node. Give each agent a token of its own this way instead of one
shared token with node:write; --policy adds more rules to it.`,
		Args: rangeArgs(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return opts.withACL(cmd.Context(), func(ctx context.Context, cl csisupdv1.ACLClient) error {
				resp, err := cl.CreateToken(ctx, &csisupdv1.ACLCreateTokenRequest{Name: name, Type: typ, Policies: policies,
					NodeIdentity: nodeIdentity})
				if err != nil {
					return controlError(opts.address, err)
				}
				return opts.printToken(cmd.OutOrStdout(), resp.GetToken())
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "a human name for the token")
	f.StringVar(&typ, "type", "client", "client (the rules of its policies) or management (everything)")
	f.StringSliceVar(&policies, "policy", nil, "a policy the token grants (repeatable)")
	f.StringVar(&nodeIdentity, "node-identity", "", "the node name a client token acts as, and only as (node:write without a policy)")
	return cmd
}

func newACLTokenListCommand(opts *clientOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the tokens (accessor ids, never secrets)",
		Args:  rangeArgs(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return opts.withACL(cmd.Context(), func(ctx context.Context, cl csisupdv1.ACLClient) error {
				resp, err := cl.ListTokens(ctx, &csisupdv1.ACLListTokensRequest{})
				if err != nil {
					return controlError(opts.address, err)
				}
				if opts.json {
					return printProto(cmd.OutOrStdout(), resp)
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tTYPE\tACCESSOR ID\tPOLICIES\tNODE IDENTITY\tCREATED")
				for _, t := range resp.GetTokens() {
					row(tw, dash(t.GetName()), t.GetType(), t.GetAccessorId(), dash(strings.Join(t.GetPolicies(), ",")),
						dash(t.GetNodeIdentity()), when(t.GetCreateTime()))
				}
				return tw.Flush()
			})
		},
	}
}

func newACLTokenInfoCommand(opts *clientOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "info ACCESSOR_ID",
		Short: "Show a token (without its secret)",
		Args:  rangeArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return opts.withACL(cmd.Context(), func(ctx context.Context, cl csisupdv1.ACLClient) error {
				resp, err := cl.GetToken(ctx, &csisupdv1.ACLGetTokenRequest{AccessorId: args[0]})
				if err != nil {
					return controlError(opts.address, err)
				}
				return opts.printToken(cmd.OutOrStdout(), resp.GetToken())
			})
		},
	}
}

func newACLTokenDeleteCommand(opts *clientOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "delete ACCESSOR_ID",
		Short: "Delete a token; it stops working at once",
		Args:  rangeArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return opts.withACL(cmd.Context(), func(ctx context.Context, cl csisupdv1.ACLClient) error {
				if _, err := cl.DeleteToken(ctx, &csisupdv1.ACLDeleteTokenRequest{AccessorId: args[0]}); err != nil {
					return controlError(opts.address, err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "Token %s deleted\n", display(args[0]))
				return nil
			})
		},
	}
}

func newACLTokenSelfCommand(opts *clientOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "self",
		Short: "Show the token the CLI uses (without its secret)",
		Args:  rangeArgs(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return opts.withACL(cmd.Context(), func(ctx context.Context, cl csisupdv1.ACLClient) error {
				resp, err := cl.TokenSelf(ctx, &csisupdv1.ACLTokenSelfRequest{})
				if err != nil {
					return controlError(opts.address, err)
				}
				return opts.printToken(cmd.OutOrStdout(), resp.GetToken())
			})
		},
	}
}

// printToken prints a token; its secret id only when the server sent it
// (bootstrap and create).
func (o *clientOptions) printToken(w io.Writer, t *csisupdv1.ACLToken) error {
	if o.json {
		return printProto(w, t)
	}
	fmt.Fprintf(w, "Accessor ID   = %s\n", display(t.GetAccessorId()))
	if t.GetSecretId() != "" {
		fmt.Fprintf(w, "Secret ID     = %s\n", display(t.GetSecretId()))
	}
	fmt.Fprintf(w, "Name          = %s\nType          = %s\nPolicies      = %s\nNode identity = %s\nCreated       = %s\n",
		dash(t.GetName()), display(t.GetType()), dash(strings.Join(t.GetPolicies(), ", ")), dash(t.GetNodeIdentity()), when(t.GetCreateTime()))
	return nil
}

// when formats a timestamp in UTC, or "-".
func when(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return ts.AsTime().UTC().Format(time.RFC3339)
}
