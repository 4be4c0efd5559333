package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/csisupd/csisupd/internal/tlsutil"
)

// Environment variables of the CLI's TLS settings, read when the matching
// flag is not given.
const (
	EnvCACert        = "CSISUPD_CACERT"
	EnvClientCert    = "CSISUPD_CLIENT_CERT"
	EnvClientKey     = "CSISUPD_CLIENT_KEY"
	EnvTLSServerName = "CSISUPD_TLS_SERVER_NAME"
)

// setting is one client setting and the flag or environment variable it
// came from, which its errors name.
type setting struct {
	value string
	from  string
}

// pick returns the flag's value when set, else the environment
// variable's.
func pick(flagValue, flag, env string, getenv func(string) string) setting {
	if flagValue != "" {
		return setting{flagValue, flag}
	}
	if v := getenv(env); v != "" {
		return setting{v, env}
	}
	return setting{}
}

// clientTLS builds the TLS configuration of the connection to the agent
// from the flags, else their environment variables. It returns nil when
// neither names a CA or a client certificate: the connection is plain.
func (o *clientOptions) clientTLS(getenv func(string) string) (*tls.Config, error) {
	ca := pick(o.caFile, "--ca-file", EnvCACert, getenv)
	cert := pick(o.certFile, "--client-cert", EnvClientCert, getenv)
	key := pick(o.keyFile, "--client-key", EnvClientKey, getenv)
	serverName := pick(o.serverName, "--tls-server-name", EnvTLSServerName, getenv)
	if ca.value == "" && cert.value == "" {
		if key.value != "" {
			return nil, fmt.Errorf("%s is set without a client certificate (--client-cert or %s): set both", key.from, EnvClientCert)
		}
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName.value}
	if ca.value != "" {
		pem, err := tlsutil.ReadPEMFile(ca.from, ca.value)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s %s: no certificate found", ca.from, ca.value)
		}
		tc.RootCAs = pool
	}
	if cert.value != "" || key.value != "" {
		pair, err := loadKeyPair(cert, key)
		if err != nil {
			return nil, err
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	return tc, nil
}

// loadKeyPair reads the CLI's client certificate and key through
// tlsutil.ReadPEMFile, so that neither can be a FIFO that blocks the
// command.
func loadKeyPair(cert, key setting) (tls.Certificate, error) {
	if cert.value == "" || key.value == "" {
		return tls.Certificate{}, errors.New("the client certificate (--client-cert or " + EnvClientCert +
			") and key (--client-key or " + EnvClientKey + ") go together: set both")
	}
	certPEM, err := tlsutil.ReadPEMFile(cert.from, cert.value)
	if err != nil {
		return tls.Certificate{}, err
	}
	keyPEM, err := tlsutil.ReadPEMFile(key.from, key.value)
	if err != nil {
		return tls.Certificate{}, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%s %s and %s %s: %w", cert.from, cert.value, key.from, key.value, err)
	}
	return pair, nil
}
