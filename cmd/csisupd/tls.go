package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/csisupd/csisupd/internal/ids"
	"github.com/csisupd/csisupd/internal/tlsutil"
)

// Files of `tls ca create`, the defaults of `tls cert create --ca/--key`.
const (
	caCertFileName = "csisupd-agent-ca.pem"
	caKeyFileName  = "csisupd-agent-ca-key.pem"
)

// maxCertIndex bounds the search for a free <region>-<role>-csisupd-<n>
// name.
const maxCertIndex = 10000

// newTLSCommand is `csisupd tls`: local commands that write a CA and
// certificates; they talk to no agent.
func newTLSCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tls",
		Short: "Create a CA and certificates for TLS between agents (local files; no agent is contacted)",
		Args:  rangeArgs(0, 0),
	}
	ca := &cobra.Command{
		Use:   "ca",
		Short: "Create the certificate authority of a cluster",
		Args:  rangeArgs(0, 0),
	}
	ca.AddCommand(newTLSCACreateCommand())
	cert := &cobra.Command{
		Use:   "cert",
		Short: "Create certificates signed by the cluster's CA",
		Args:  rangeArgs(0, 0),
	}
	cert.AddCommand(newTLSCertCreateCommand())
	cmd.AddCommand(ca, cert)
	return cmd
}

func newTLSCACreateCommand() *cobra.Command {
	var (
		days        int
		domain, dir string
		constraints []string
	)
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create a CA: " + caCertFileName + " and " + caKeyFileName,
		Long: "Create a certificate authority in --dir: " + caCertFileName + " (the certificate, for\n" +
			"every agent's tls.ca_file) and " + caKeyFileName + " (its private key, mode 0600: keep it\n" +
			"off the agents). Its name constraints let it sign DNS names only in --domain, the role\n" +
			"names' domain csisupd, localhost and every --additional-name-constraint; IP addresses are\n" +
			"not constrained. Existing files are never overwritten.",
		Args: rangeArgs(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if days <= 0 {
				return usageError{fmt.Errorf("--days %d: must be positive", days)}
			}
			if domain == "" {
				return usageError{errors.New("--domain: must not be empty")}
			}
			certPEM, keyPEM, err := tlsutil.GenerateCA(tlsutil.CAOptions{Days: days, Domain: domain, AdditionalConstraints: constraints})
			if err != nil {
				return err
			}
			paths, err := tlsutil.WriteFiles(dir, tlsutil.CertFile(caCertFileName, certPEM), tlsutil.KeyFile(caKeyFileName, keyPEM))
			if err != nil {
				return fmt.Errorf("CA files: %w", err)
			}
			return printSaved(cmd.OutOrStdout(), paths)
		},
	}
	f := cmd.Flags()
	f.IntVar(&days, "days", tlsutil.DefaultCADays, "days the CA is valid")
	f.StringVar(&domain, "domain", tlsutil.DefaultDomain, "DNS domain the CA may sign names in")
	f.StringSliceVar(&constraints, "additional-name-constraint", nil, "another DNS domain the CA may sign names in (repeatable)")
	f.StringVar(&dir, "dir", ".", "directory to write the files to")
	return cmd
}

// certCreateFlags are the flags of `tls cert create`.
type certCreateFlags struct {
	server, client, cli bool
	region              string
	days                int
	caFile, keyFile     string
	dnsNames, ips       []string
	dir                 string
	node                string
}

func newTLSCertCreateCommand() *cobra.Command {
	var fl certCreateFlags
	cmd := &cobra.Command{
		Use:   "create --server|--client [--node NAME]|--cli",
		Short: "Create a certificate and key for a server, a node agent or an operator",
		Long: "Create a certificate and key of one role, signed by the CA, in --dir:\n" +
			"<region>-<role>-csisupd-<n>.pem and <region>-<role>-csisupd-<n>-key.pem (mode 0600), n the\n" +
			"first number whose files do not exist yet, so that one directory can hold the certificates\n" +
			"of several servers. Server and client certificates carry the names <role>.<region>.csisupd,\n" +
			"localhost and 127.0.0.1 and serve both ends of a connection; CLI certificates carry\n" +
			"cli.<region>.csisupd and localhost and authenticate clients only. --additional-dnsname and\n" +
			"--additional-ipaddress add names. --ca and --key default to " + caCertFileName + " and\n" +
			caKeyFileName + " in --dir.\n\n" +
			"--client --node NAME makes the certificate of node NAME: it names the node in a URI SAN,\n" +
			"csisupd://<region>/node/NAME. Servers with tls.verify_node_name = true refuse the node\n" +
			"calls of a client certificate that names another node, or none; an agent with it refuses\n" +
			"to start with a certificate naming another node than its name. Make one per node.",
		Args: rangeArgs(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runCertCreate(cmd.OutOrStdout(), fl)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&fl.server, "server", false, "a server certificate (server.<region>.csisupd)")
	f.BoolVar(&fl.client, "client", false, "a node agent's certificate (client.<region>.csisupd)")
	f.BoolVar(&fl.cli, "cli", false, "an operator's certificate for the CLI (cli.<region>.csisupd)")
	f.StringVar(&fl.region, "region", tlsutil.DefaultRegion, "region of the role name")
	f.IntVar(&fl.days, "days", tlsutil.DefaultCertDays, "days the certificate is valid")
	f.StringVar(&fl.caFile, "ca", "", "CA certificate (default "+caCertFileName+" in --dir)")
	f.StringVar(&fl.keyFile, "key", "", "CA private key (default "+caKeyFileName+" in --dir)")
	f.StringSliceVar(&fl.dnsNames, "additional-dnsname", nil, "another DNS name of the certificate (repeatable)")
	f.StringSliceVar(&fl.ips, "additional-ipaddress", nil, "another IP address of the certificate (repeatable)")
	f.StringVar(&fl.dir, "dir", ".", "directory to write the files to")
	f.StringVar(&fl.node, "node", "", "with --client: the name of the node the certificate is for")
	return cmd
}

func runCertCreate(w io.Writer, fl certCreateFlags) error {
	var roles []tlsutil.Role
	for _, r := range []struct {
		set  bool
		role tlsutil.Role
	}{{fl.server, tlsutil.RoleServer}, {fl.client, tlsutil.RoleClient}, {fl.cli, tlsutil.RoleCLI}} {
		if r.set {
			roles = append(roles, r.role)
		}
	}
	if len(roles) != 1 {
		return usageError{fmt.Errorf("exactly one of --server, --client and --cli is required (got %d)", len(roles))}
	}
	role := roles[0]
	if fl.node != "" {
		if role != tlsutil.RoleClient {
			return usageError{fmt.Errorf("--node %q: only a --client certificate names a node", fl.node)}
		}
		if err := ids.CheckNodeName(fl.node); err != nil {
			return usageError{fmt.Errorf("--node %w", err)}
		}
	}
	if err := tlsutil.CheckRegion(fl.region); err != nil || fl.region == "" {
		return usageError{fmt.Errorf("--region %q: must be one DNS label (letters, digits and inner hyphens)", fl.region)}
	}
	if fl.days <= 0 {
		return usageError{fmt.Errorf("--days %d: must be positive", fl.days)}
	}
	for _, n := range fl.dnsNames {
		if n == "" {
			return usageError{errors.New("--additional-dnsname: must not be empty")}
		}
	}
	var ips []net.IP
	for _, s := range fl.ips {
		ip := net.ParseIP(s)
		if ip == nil {
			return usageError{fmt.Errorf("--additional-ipaddress %q: not an IP address", s)}
		}
		ips = append(ips, ip)
	}
	caFile, keyFile := fl.caFile, fl.keyFile
	if caFile == "" {
		caFile = filepath.Join(fl.dir, caCertFileName)
	}
	if keyFile == "" {
		keyFile = filepath.Join(fl.dir, caKeyFileName)
	}
	caPEM, err := tlsutil.ReadPEMFile("--ca", caFile)
	if err != nil {
		return err
	}
	caKeyPEM, err := tlsutil.ReadPEMFile("--key", keyFile)
	if err != nil {
		return err
	}
	certPEM, keyPEM, err := tlsutil.GenerateCert(tlsutil.CertOptions{
		CACertPEM: caPEM, CAKeyPEM: caKeyPEM, Role: role, Region: fl.region, Days: fl.days,
		DNSNames: fl.dnsNames, IPAddresses: ips, NodeName: fl.node,
	})
	if err != nil {
		return fmt.Errorf("with the CA %s and %s: %w", caFile, keyFile, err)
	}
	paths, err := writeNextCert(fl.dir, fmt.Sprintf("%s-%s-csisupd", fl.region, role), certPEM, keyPEM)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(w, "==> Using %s and %s\n", display(caFile), display(keyFile)); err != nil {
		return err
	}
	return printSaved(w, paths)
}

// writeNextCert writes <prefix>-<n>.pem and <prefix>-<n>-key.pem into dir,
// n the first number for which neither file exists.
func writeNextCert(dir, prefix string, certPEM, keyPEM []byte) ([]string, error) {
	for n := range maxCertIndex {
		base := fmt.Sprintf("%s-%d", prefix, n)
		if exists(filepath.Join(dir, base+".pem")) || exists(filepath.Join(dir, base+"-key.pem")) {
			continue
		}
		paths, err := tlsutil.WriteFiles(dir, tlsutil.CertFile(base+".pem", certPEM), tlsutil.KeyFile(base+"-key.pem", keyPEM))
		if errors.Is(err, fs.ErrExist) {
			continue // created since we looked
		}
		if err != nil {
			return nil, fmt.Errorf("certificate files: %w", err)
		}
		return paths, nil
	}
	return nil, fmt.Errorf("certificate files: %s has %s-0 to %s-%d already", dir, prefix, prefix, maxCertIndex-1)
}

// exists reports whether something is at path; an error other than "does
// not exist" counts as existing, so that the file is never written over.
func exists(path string) bool {
	_, err := os.Lstat(path)
	return !errors.Is(err, fs.ErrNotExist)
}

// printSaved prints "==> Saved <path>" for each file written.
func printSaved(w io.Writer, paths []string) error {
	for _, p := range paths {
		if _, err := fmt.Fprintf(w, "==> Saved %s\n", display(p)); err != nil {
			return err
		}
	}
	return nil
}
