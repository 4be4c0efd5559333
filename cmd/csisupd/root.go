package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/safefile"
)

// DefaultAddress is the agent address client commands use without
// --address or CSISUPD_ADDR.
const DefaultAddress = "127.0.0.1:4780"

// clientOptions are the global flags of commands that talk to an agent.
type clientOptions struct {
	address    string
	json       bool
	caFile     string
	certFile   string
	keyFile    string
	serverName string
	token      string
	tokenFile  string
	timeout    time.Duration
}

// Environment variables of the CLI's token, read in this order after
// --token.
const (
	EnvToken     = "CSISUPD_TOKEN"
	EnvTokenFile = "CSISUPD_TOKEN_FILE"
)

func newRootCommand() *cobra.Command {
	opts := &clientOptions{}
	root := &cobra.Command{
		Use:           "csisupd",
		Short:         "csisupd supervises the CSI plugins of a node",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	// --version prints what `csisupd version` prints (cobra's own Version
	// field would print a template, without --json). Without it the bare
	// command shows its help, as a command that only groups others does.
	var showVersion bool
	root.Flags().BoolVarP(&showVersion, "version", "v", false, "print the csisupd version, as the version command does")
	// Runnable for --version, the root takes its arguments itself, as
	// guardGroups makes the other groups do: an unknown command is a
	// usage error with suggestions.
	root.Args = cobra.ArbitraryArgs
	root.DisableFlagsInUseLine = true
	root.RunE = func(cmd *cobra.Command, args []string) error {
		switch {
		case len(args) > 0:
			return unknownCommand(cmd, args[0])
		case showVersion:
			return printVersion(cmd.OutOrStdout(), opts.json)
		}
		return cmd.Help()
	}
	addr := os.Getenv("CSISUPD_ADDR")
	if addr == "" {
		addr = DefaultAddress
	}
	pf := root.PersistentFlags()
	pf.StringVar(&opts.address, "address", addr, "agent gRPC address (env CSISUPD_ADDR)")
	pf.BoolVar(&opts.json, "json", false, "print JSON")
	pf.StringVar(&opts.caFile, "ca-file", "", "CA certificate to verify the agent (enables TLS; env "+EnvCACert+")")
	pf.StringVar(&opts.certFile, "client-cert", "", "client certificate for mutual TLS (env "+EnvClientCert+")")
	pf.StringVar(&opts.keyFile, "client-key", "", "client key for mutual TLS (env "+EnvClientKey+")")
	pf.StringVar(&opts.serverName, "tls-server-name", "", "server name to verify in the agent's certificate (env "+EnvTLSServerName+")")
	pf.StringVar(&opts.token, "token", "", "ACL token secret id (else --token-file, else env "+EnvToken+", else the file named by "+EnvTokenFile+")")
	pf.StringVar(&opts.tokenFile, "token-file", "", "file holding the ACL token secret id")
	pf.DurationVar(&opts.timeout, "timeout", 10*time.Second, "timeout of one request")

	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(
		newAgentCommand(),
		newStatusCommand(opts),
		newEventsCommand(opts),
		newMonitorCommand(opts),
		newVersionCommand(opts),
		newPluginCommand(opts),
		newNodeCommand(opts),
		newVolumeCommand(opts),
		newOperatorCommand(opts),
		newACLCommand(opts),
		newTLSCommand(),
		newValidateCommand(),
	)
	// Cobra adds its completion command at Execute; it is added here so
	// that guardGroups covers it too.
	root.InitDefaultCompletionCmd()
	root.SetHelpCommand(newHelpCommand())
	guardGroups(root)
	registerCompletions(root, opts)
	return root
}

// rangeArgs is cobra.RangeArgs with usage errors.
func rangeArgs(min, max int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := cobra.RangeArgs(min, max)(cmd, args); err != nil {
			return usageError{err}
		}
		return nil
	}
}

// dial connects to the agent named by the global flags.
func (o *clientOptions) dial() (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	tc, err := o.clientTLS(os.Getenv)
	if err != nil {
		return nil, err
	}
	if tc != nil {
		creds = credentials.NewTLS(tc)
	}
	// Calls that reach no agent are marked, so that agentError says
	// "cannot reach" only for them.
	// A call refused for want of a leader is retried within --timeout.
	// An error the leader answered names it.
	dialOpts := append([]grpc.DialOption{grpc.WithTransportCredentials(creds), grpc.WithChainUnaryInterceptor(retryNoLeader(o.timeout)),
		csisupdv1.LeaderInterceptor()}, csisupdv1.NotReachedInterceptors()...)
	token, err := o.resolveToken(os.Getenv)
	if err != nil {
		return nil, err
	}
	if token != "" {
		if tc == nil {
			return nil, usageError{errors.New("a token is set but the connection has no TLS (--ca-file or " + EnvCACert + "): refusing to send the token in plain text")}
		}
		dialOpts = append(dialOpts, grpc.WithPerRPCCredentials(csisupdv1.TokenCredentials{Secret: token}))
	}
	conn, err := grpc.NewClient(o.address, dialOpts...)
	if err != nil {
		return nil, fmt.Errorf("agent address %q: %w", o.address, err)
	}
	return conn, nil
}

// resolveToken returns the ACL token of the call: --token, else the file
// --token-file names, else CSISUPD_TOKEN, else the file CSISUPD_TOKEN_FILE
// names.
func (o *clientOptions) resolveToken(getenv func(string) string) (string, error) {
	if o.token != "" && o.tokenFile != "" {
		return "", usageError{errors.New("--token and --token-file exclude each other: give one")}
	}
	if o.token != "" {
		return o.token, nil
	}
	if o.tokenFile != "" {
		return readTokenFile("--token-file", o.tokenFile)
	}
	if t := getenv(EnvToken); t != "" {
		return t, nil
	}
	if file := getenv(EnvTokenFile); file != "" {
		return readTokenFile(EnvTokenFile, file)
	}
	return "", nil
}

// readTokenFile reads a token from a regular file of at most
// maxTokenFileSize bytes, without the spaces and newline around it; what
// names the flag or variable that named the file.
func readTokenFile(what, file string) (string, error) {
	data, err := safefile.Read(context.Background(), file, safefile.Spec{What: what, MaxSize: maxTokenFileSize})
	if err != nil {
		return "", err
	}
	t := strings.TrimSpace(string(data))
	if t == "" {
		return "", fmt.Errorf("%s: %s is empty", what, file)
	}
	return t, nil
}

// maxTokenFileSize caps a token file: a token is a UUID.
const maxTokenFileSize = 4 << 10

// requestContext bounds one request by --timeout.
func (o *clientOptions) requestContext(parent context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(parent, o.timeout)
}

// printProto writes msg as one indented JSON document. Every --json output
// is an API message: the response of the command's call, the one object a
// get or a write returns (ClusterPlugin, ClusterNode, Volume), or, where no
// RPC returns the result, a message of cli.proto. The encoding is the
// proto3 JSON mapping with the proto field names and every field present
// (null, [], {}, 0, "" or false when unset), so that scripts find the same
// keys whatever the values are. 64-bit integers are strings in it.
func printProto(w io.Writer, msg proto.Message) error { return writeProto(w, msg, true) }

// printProtoLine writes msg as printProto does, on one line; streams such
// as `events --json` print one message per line.
func printProtoLine(w io.Writer, msg proto.Message) error { return writeProto(w, msg, false) }

// writeProto writes msg's protojson. protojson varies its whitespace from
// build to build on purpose; the output is laid out again by encoding/json
// (compact, or indented by two spaces), so that it is the same for every
// build and a line of `events --json` reads "key":"value".
func writeProto(w io.Writer, msg proto.Message, multiline bool) error {
	opts := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}
	b, err := opts.Marshal(msg)
	if err != nil {
		return fmt.Errorf("JSON of %s: %w", msg.ProtoReflect().Descriptor().Name(), err)
	}
	var out bytes.Buffer
	if multiline {
		err = json.Indent(&out, b, "", "  ")
	} else {
		err = json.Compact(&out, b)
	}
	if err != nil {
		return fmt.Errorf("JSON of %s: %w", msg.ProtoReflect().Descriptor().Name(), err)
	}
	out.WriteByte('\n')
	_, err = w.Write(out.Bytes())
	return err
}
