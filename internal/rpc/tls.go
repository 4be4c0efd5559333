package rpc

import (
	"crypto/tls"
	"errors"
	"fmt"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/config"
)

// ServerTLSConfig builds the TLS configuration of the gRPC server from the
// PEM files in cfg. It returns nil, and no error, when cfg sets no files:
// the server then runs without TLS. With ca_file set, clients must present a
// certificate signed by one of its certificates (mutual TLS). Errors name the
// field and file that could not be used.
func ServerTLSConfig(cfg config.TLSConfig) (*tls.Config, error) {
	switch {
	case cfg.CertFile == "" && cfg.KeyFile == "" && cfg.CAFile == "":
		return nil, nil
	case cfg.CertFile == "" || cfg.KeyFile == "":
		return nil, errors.New("csisupd: tls cert_file and key_file must both be set to serve TLS")
	}
	cert, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("csisupd: tls cert_file %q / key_file %q: %w", cfg.CertFile, cfg.KeyFile, err)
	}
	tc := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
	}
	if cfg.CAFile != "" {
		pool, err := csisupdv1.LoadCertPool(cfg.CAFile)
		if err != nil {
			return nil, err
		}
		tc.ClientCAs = pool
		tc.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return tc, nil
}

// ClientTLSConfig builds the TLS configuration with which one csisupd
// process (a server, or the CLI) calls another, from the PEM files in cfg:
// ca_file verifies the peer, cert_file and key_file are presented as the
// client certificate. serverName, when not empty, is the name checked in the
// peer's certificate. It returns nil, and no error, when cfg sets no files.
func ClientTLSConfig(cfg config.TLSConfig, serverName string) (*tls.Config, error) {
	if cfg.CertFile == "" && cfg.KeyFile == "" && cfg.CAFile == "" {
		return nil, nil
	}
	return csisupdv1.TLSFiles{
		CAFile:     cfg.CAFile,
		CertFile:   cfg.CertFile,
		KeyFile:    cfg.KeyFile,
		ServerName: serverName,
	}.ClientConfig()
}
